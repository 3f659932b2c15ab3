package replica

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/wlproj/wlproj/mask"
	"github.com/wlproj/wlproj/projection"
)

// The projections file (OUTBOX_PROJECTIONS_FILE) names each projection
// producers write in outbox_events.projection and how it is built. It is
// YAML, read with go.yaml.in/yaml/v3 (the YAML organisation's maintained
// v3, already wlproj's dependency): the format operators already edit by
// hand for Kubernetes and Compose, with comments, and whose node tree
// keeps each key's line for the errors below. Secrets are named by
// reference (an environment variable or a file), never written inline.

// Spec is one configured projection.
type Spec struct {
	Name string `json:"name"`
	// Kind is KindSearch or KindChronicle.
	Kind      string         `json:"kind"`
	Search    *SearchSpec    `json:"search,omitempty"`
	Chronicle *ChronicleSpec `json:"chronicle,omitempty"`
	// Mask is the paths of the payload fields hidden wherever a payload
	// or an error quoting one is shown (package mask); masker is them
	// compiled.
	Mask   []string `json:"mask,omitempty"`
	masker *mask.Mask
	// file and lines are where it was read: the projections file and the
	// line of each of its keys, for what is checked later (its tables).
	file  string
	lines map[string]int
}

// at is a *ProjectionsError about key of the projection, at its line in
// the file it was read from.
func (s Spec) at(key, format string, args ...any) error {
	return &ProjectionsError{File: s.file, Projection: s.Name, Key: key, Line: s.lines[key], Problem: fmt.Sprintf(format, args...)}
}

// ChronicleSpec is a chronicle projection: a table every event is
// appended to.
type ChronicleSpec struct {
	// Table is table or schema.table in the outbox's database; empty:
	// projection.ChronicleTableDefault.
	Table string `json:"table,omitempty"`
}

// TableName is the table the chronicle appends to.
func (c *ChronicleSpec) TableName() string {
	if c == nil || c.Table == "" {
		return projection.ChronicleTableDefault
	}
	return c.Table
}

// The kinds a projection may have.
const (
	KindSearch    = "search"
	KindChronicle = "chronicle"
)

// SearchSpec is a search projection: an index alias on an engine.
type SearchSpec struct {
	// Engine is how to reach the engine; its secrets are resolved from
	// PasswordFrom and APIKeyFrom and never listed.
	Engine projection.ElasticOptions `json:"-"`
	// URLs are the engine's nodes.
	URLs []string `json:"urls"`
	// Username is basic auth's user, if any.
	Username string `json:"username,omitempty"`
	// PasswordFrom and APIKeyFrom say where the secret comes from:
	// "env NAME" or "file PATH".
	PasswordFrom string `json:"password_from,omitempty"`
	APIKeyFrom   string `json:"api_key_from,omitempty"`
	CAFile       string `json:"ca_file,omitempty"`
	// Timeout bounds each request to this engine, and so the index's write
	// lifetime; zero: ELASTIC_TIMEOUT_SECONDS.
	Timeout time.Duration `json:"timeout,omitempty"`
	// Index is the alias the projection writes.
	Index string `json:"index"`
	// MappingFile is the JSON body wlproj creates the index with; Mapping
	// is its content and MappingDigest identifies it in the hash.
	MappingFile   string         `json:"mapping_file,omitempty"`
	Mapping       map[string]any `json:"-"`
	MappingDigest string         `json:"mapping_digest,omitempty"`
	// SourceTable is the source of truth for rebuild and verify.
	SourceTable string `json:"source_table,omitempty"`
	// MaxPayloadBytes is the largest upsert payload.
	MaxPayloadBytes int `json:"max_payload_bytes"`
	// Bulk is how the projection's batches are sent; zeros: the defaults.
	Bulk BulkSpec `json:"bulk,omitzero"`
}

// BulkSpec is a search projection's sending settings: its _bulk requests'
// size and how many of one batch are in flight at once (see
// projection.SearchConfig). How many events a batch holds is the loop's
// (OUTBOX_BATCH_SIZE), for every projection.
type BulkSpec struct {
	Actions     int `json:"actions,omitempty"`
	Bytes       int `json:"bytes,omitempty"`
	Concurrency int `json:"concurrency,omitempty"`
}

// ProjectionsError is a bad projections file: the file, the projection
// and the key, with the line where it is.
type ProjectionsError struct {
	File, Projection, Key string
	Line                  int
	Problem               string
}

func (e *ProjectionsError) Error() string {
	where := e.File
	if e.Line > 0 {
		where += fmt.Sprintf(":%d", e.Line)
	}
	if e.Projection != "" {
		where += fmt.Sprintf(": projection %q", e.Projection)
	}
	if e.Key != "" {
		where += ": " + e.Key
	}
	return where + ": " + e.Problem
}

// projectionName is what producers may write in outbox_events.projection
// and what a metric label and a URL carry unescaped.
var projectionName = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,62}$`)

// Specs is the configured set, in the file's order.
type Specs []Spec

// Names lists the projections, sorted.
func (s Specs) Names() []string {
	names := make([]string, 0, len(s))
	for _, p := range s {
		names = append(names, p.Name)
	}
	slices.Sort(names)
	return names
}

// Masks are the projections' compiled masks, by name; a projection
// without one is absent (the nil *mask.Mask masks nothing).
func (s Specs) Masks() map[string]*mask.Mask {
	masks := map[string]*mask.Mask{}
	for _, p := range s {
		if !p.masker.Empty() {
			masks[p.Name] = p.masker
		}
	}
	return masks
}

// Known reports whether name is configured.
func (s Specs) Known(name string) bool { return slices.Contains(s.Names(), name) }

// Hash identifies the set as it is built, secrets left out (their
// sources are in): two replicas with the same hash build the same
// projections.
func (s Specs) Hash() string {
	body, _ := json.Marshal(s)
	sum := sha256.Sum256(body)
	return hex.EncodeToString(sum[:8])
}

// LoadProjections reads and checks the projections file at path; getenv
// resolves the secrets named by environment variable. Nothing is built and
// nothing connects.
func LoadProjections(path string, getenv func(string) string) (Specs, error) {
	return fileReader{path: path, getenv: getenv}.load()
}

// LoadProjectionsUnresolved reads and checks the projections file at path
// as LoadProjections does, but leaves the engines' secrets unread (their
// sources are listed): for the commands that build no engine client.
func LoadProjectionsUnresolved(path string) (Specs, error) {
	return fileReader{path: path, namesOnly: true}.load()
}

// LoadProjectionNames is the names of LoadProjectionsUnresolved's set.
func LoadProjectionNames(path string) ([]string, error) {
	specs, err := LoadProjectionsUnresolved(path)
	return specs.Names(), err
}

func (f fileReader) load() (Specs, error) {
	path := f.path
	body, err := os.ReadFile(path)
	if err != nil {
		return nil, &ProjectionsError{File: path, Problem: "cannot be read: " + unwrapPath(err)}
	}
	var doc yaml.Node
	if err := yaml.NewDecoder(bytes.NewReader(body)).Decode(&doc); errors.Is(err, io.EOF) {
		return nil, &ProjectionsError{File: path, Problem: "is empty: it must list the projections under projections:"}
	} else if err != nil {
		return nil, &ProjectionsError{File: path, Problem: "is not YAML: " + strings.TrimPrefix(err.Error(), "yaml: ")}
	}
	return f.read(&doc)
}

// unwrapPath is an *os.PathError's cause, the path being said already.
func unwrapPath(err error) string {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err.Error()
	}
	return err.Error()
}

// DefaultSpecs is the set without a file: today's two projections, the
// search index that cfg's ELASTIC_* settings describe (verified against
// OUTBOX_VERIFY_FROM_TABLE) and the chronicle.
func DefaultSpecs(cfg Config) Specs {
	search := &SearchSpec{Engine: cfg.Elastic, URLs: nodeURLs(cfg.Elastic.URL), Index: cmp.Or(cfg.Index, projection.IndexDefault),
		Username: cfg.Elastic.Username, CAFile: cfg.Elastic.CAFile, MaxPayloadBytes: cmp.Or(cfg.MaxPayloadBytes, projection.MaxPayloadBytesDefault),
		SourceTable: cfg.Verify.SourceTable}
	if cfg.Elastic.Password != "" {
		search.PasswordFrom = "env ELASTIC_PASSWORD"
	}
	if cfg.Elastic.APIKey != "" {
		search.APIKeyFrom = "env ELASTIC_API_KEY"
	}
	return Specs{{Name: projection.SearchName, Kind: KindSearch, Search: search}, {Name: projection.ChronicleName, Kind: KindChronicle}}
}

// nodeURLs is ELASTIC_URL's nodes as a projections file lists them, without
// the credentials ELASTIC_URL may carry (a file's URLs never do), so that
// nothing that lists or hashes the set sees them; none when the client
// would refuse the URL anyway.
func nodeURLs(raw string) []string {
	nodes, _, _, err := projection.ParseNodes(raw)
	if err != nil {
		return nil
	}
	urls := make([]string, len(nodes))
	for i, n := range nodes {
		urls[i] = n.String()
	}
	return urls
}

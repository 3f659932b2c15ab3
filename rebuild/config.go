package rebuild

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/olivere/elastic/v7"

	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/mask"
	"github.com/wlproj/wlproj/projection"
)

// Defaults of Config; the CLI's flags take them from here.
const (
	EmitRateDefault       = 1000
	EmitBacklogDefault    = 2000
	ConfirmTimeoutDefault = 30 * time.Second
	AbortGraceDefault     = time.Minute
)

// Ranges Config accepts.
var (
	EmitRateRange       = bounds.Range[int]{Min: 1, Max: 1_000_000}
	EmitBacklogRange    = bounds.Range[int]{Min: 1, Max: 1_000_000}
	ConfirmTimeoutRange = bounds.Range[time.Duration]{Min: time.Second, Max: time.Hour}
)

// Config says what to rebuild, from where, and how.
type Config struct {
	// Pool is the outbox database. Required.
	Pool *pgxpool.Pool
	// Client is the engine's client, the daemon's (projection.NewElasticClient). Required.
	Client *elastic.Client
	// Projection to rebuild. Defaults to search, the only one with an index.
	Projection string
	// Alias is the name readers and the daemon use (ELASTIC_INDEX). Required.
	Alias string
	// SourceTable is the SoT table (see readSource for its columns). Required by Run.
	SourceTable string
	// Mapping is the new index's create-index body (settings and mappings),
	// or a bare mapping. Defaults to the current index's mapping and settings.
	Mapping []byte
	// MappingFile names Mapping in messages.
	MappingFile string
	// EmitOutbox enqueues an upsert event per source row instead of
	// bulk-loading. Defaults to false.
	EmitOutbox bool
	// EmitRate is the most rows a second EmitOutbox enqueues. Defaults to 1000.
	EmitRate int
	// EmitBacklog is the most pending events of the projection EmitOutbox
	// lets wait before it enqueues more. Defaults to 2000.
	EmitBacklog int
	// BulkSize is the rows per bulk request or enqueued chunk. Defaults to 500, the daemon's.
	BulkSize int
	// Concurrency is the bulk requests in flight. Defaults to 2, the daemon's.
	Concurrency int
	// MaxPayloadBytes is the largest doc loaded; a larger one is refused as
	// payload_invalid. Defaults to the search handler's 1 MiB.
	MaxPayloadBytes int
	// AllowRefused swaps even though the new index lacks documents the
	// old one has because their rows were refused (the new mapping, a
	// payload over the limit, a failed emitted event); the swap's audit
	// row names them. Defaults to false: such a swap is refused.
	AllowRefused bool
	// ConfirmTimeout bounds the wait for a leader to confirm dual-writes. Defaults to 30s.
	ConfirmTimeout time.Duration
	// AbortGrace is how long Cleanup keeps an aborted rebuild's index, for
	// dual-writes still in flight. Defaults to 1m.
	AbortGrace time.Duration
	// By and Why go into every audit row. Required.
	By, Why string
	// Progress receives the progress. Defaults to none.
	Progress Progress
	// Mask hides the projection's masked payload fields (package mask) in
	// a refused row's message, which may quote the refused value.
	// Defaults to none.
	Mask *mask.Mask
	// OnRefused is called with each refused row as it is found. Optional.
	OnRefused func(Refused)
	// Now names the new index. Defaults to time.Now.
	Now func() time.Time
}

func (c Config) withDefaults() Config {
	c.Projection = cmp.Or(c.Projection, projection.SearchName)
	c.EmitRate = cmp.Or(c.EmitRate, EmitRateDefault)
	c.EmitBacklog = cmp.Or(c.EmitBacklog, EmitBacklogDefault)
	c.BulkSize = cmp.Or(c.BulkSize, projection.BulkSizeDefault)
	c.Concurrency = cmp.Or(c.Concurrency, projection.ConcurrencyDefault)
	c.ConfirmTimeout = cmp.Or(c.ConfirmTimeout, ConfirmTimeoutDefault)
	c.AbortGrace = cmp.Or(c.AbortGrace, AbortGraceDefault)
	c.MaxPayloadBytes = cmp.Or(c.MaxPayloadBytes, projection.MaxPayloadBytesDefault)
	if c.Progress == nil {
		c.Progress = noProgress{}
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate returns a *bounds.FieldError for a bad setting, or an
// *InputError for a projection that cannot be rebuilt or a mapping that is
// not a JSON object.
func (c Config) Validate() error {
	switch {
	case c.Pool == nil:
		return errors.New("rebuild: a database pool is required")
	case c.Client == nil:
		return errors.New("rebuild: an engine client is required")
	case strings.TrimSpace(c.By) == "":
		return bounds.Invalid("By", "is required")
	case strings.TrimSpace(c.Why) == "":
		return bounds.Invalid("Why", "is required")
	case c.Alias == "":
		return bounds.Invalid("Alias", "is required")
	case c.Projection == projection.ChronicleName:
		// chronicle is a Postgres timeline of every event, not a projection
		// of the SoT; which projections are search ones is the caller's to
		// say (the projections file).
		return inputf("projection %q cannot be rebuilt: it is the chronicle, a timeline of events, not an index built from a source table", c.Projection)
	}
	if _, err := c.mappingBody(); err != nil {
		return err
	}
	return bounds.First(
		bounds.Check("BulkSize", c.BulkSize, projection.BulkSizeRange),
		bounds.Check("Concurrency", c.Concurrency, projection.ConcurrencyRange),
		bounds.Check("EmitRate", c.EmitRate, EmitRateRange),
		bounds.Check("EmitBacklog", c.EmitBacklog, EmitBacklogRange),
		bounds.Check("ConfirmTimeout", c.ConfirmTimeout, ConfirmTimeoutRange),
		bounds.Check("MaxPayloadBytes", c.MaxPayloadBytes, projection.MaxPayloadBytesRange),
	)
}

// mappingBody parses Mapping into a create-index body; a bare mapping
// ({"properties": …}) is wrapped in "mappings". Nil when there is none.
func (c Config) mappingBody() (map[string]any, error) {
	if c.Mapping == nil {
		return nil, nil
	}
	var body map[string]any
	dec := json.NewDecoder(bytes.NewReader(c.Mapping))
	dec.UseNumber()
	if err := dec.Decode(&body); err != nil || body == nil || dec.More() {
		return nil, inputf("mapping file %s is not a JSON object", cmp.Or(c.MappingFile, "(given)"))
	}
	_, settings := body["settings"]
	_, mappings := body["mappings"]
	if !settings && !mappings {
		body = map[string]any{"mappings": body}
	}
	return body, nil
}

// mappingSHA256 identifies the mapping file, so that a re-run can tell it
// is given the same one; empty when the mapping was copied.
func (c Config) mappingSHA256() string {
	if c.Mapping == nil {
		return ""
	}
	sum := sha256.Sum256(c.Mapping)
	return hex.EncodeToString(sum[:])
}

// Progress receives a rebuild's progress: phases (load, emit, drain) with
// their totals, rows done, and notes about what it does.
type Progress interface {
	Phase(name string, total int64)
	Add(n int64)
	Set(n int64)
	Note(msg string)
}

type noProgress struct{}

func (noProgress) Phase(string, int64) {}
func (noProgress) Add(int64)           {}
func (noProgress) Set(int64)           {}
func (noProgress) Note(string)         {}

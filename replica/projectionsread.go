package replica

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/mask"
	"github.com/wlproj/wlproj/projection"
)

// fileReader walks the projections file's node tree, so that every error
// names the file, the projection, the key and its line.
type fileReader struct {
	path   string
	getenv func(string) string
	// namesOnly leaves the secrets unresolved: a command that needs the
	// names (pause, status) runs without the engines' secrets.
	namesOnly bool
}

func (f fileReader) fail(n *yaml.Node, projection, key, format string, args ...any) error {
	line := 0
	if n != nil {
		line = n.Line
	}
	return &ProjectionsError{File: f.path, Projection: projection, Key: key, Line: line, Problem: fmt.Sprintf(format, args...)}
}

// The keys each level accepts; any other is refused, so that a misspelt
// key does not silently leave its setting at the default.
var (
	topKeys       = []string{"projections"}
	searchKeys    = []string{"kind", "engine", "index", "mapping_file", "source_table", "max_payload_bytes", "bulk", "mask"}
	bulkKeys      = []string{"actions", "bytes", "concurrency"}
	chronicleKeys = []string{"kind", "table", "mask"}
	engineKeys    = []string{"urls", "username", "password_env", "password_file", "api_key_env", "api_key_file", "ca_file", "timeout", "password", "api_key"}
)

// mapping returns n's keys and values, refusing a key not in allowed.
func (f fileReader) mapping(n *yaml.Node, projection, what string, allowed []string) (map[string]*yaml.Node, error) {
	if n.Kind != yaml.MappingNode {
		return nil, f.fail(n, projection, what, "must be a mapping of keys to values")
	}
	m := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i]
		if !slices.Contains(allowed, k.Value) {
			return nil, f.fail(k, projection, strings.TrimPrefix(what+"."+k.Value, "."),
				"unknown key (known here: %s)", strings.Join(allowed, ", "))
		}
		if _, dup := m[k.Value]; dup {
			return nil, f.fail(k, projection, strings.TrimPrefix(what+"."+k.Value, "."), "given twice")
		}
		m[k.Value] = n.Content[i+1]
	}
	return m, nil
}

func (f fileReader) read(doc *yaml.Node) (Specs, error) {
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return nil, f.fail(nil, "", "", "is empty: it must list the projections under projections:")
	}
	top, err := f.mapping(doc.Content[0], "", "", topKeys)
	if err != nil {
		return nil, err
	}
	list, ok := top["projections"]
	if !ok || list.Kind != yaml.MappingNode || len(list.Content) == 0 {
		return nil, f.fail(doc.Content[0], "", "projections", "must map each projection's name to its settings, at least one")
	}
	var specs Specs
	var set setCheck
	for i := 0; i+1 < len(list.Content); i += 2 {
		name := list.Content[i]
		if !projectionName.MatchString(name.Value) {
			return nil, f.fail(name, name.Value, "", "is not a projection name: lower-case letters, digits, - and _, starting with a letter, at most 63")
		}
		if specs.Known(name.Value) {
			return nil, f.fail(name, name.Value, "", "is configured twice")
		}
		spec, err := f.projection(name.Value, list.Content[i+1])
		if err != nil {
			return nil, err
		}
		if err := f.checkAdded(&set, spec, list.Content[i+1]); err != nil {
			return nil, err
		}
		specs = append(specs, spec)
	}
	return specs, nil
}

func (f fileReader) projection(name string, n *yaml.Node) (Spec, error) {
	if n.Kind != yaml.MappingNode {
		return Spec{}, f.fail(n, name, "", "must be a mapping of its settings")
	}
	kinds := map[string][]string{KindSearch: searchKeys, KindChronicle: chronicleKeys}
	kind := ""
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == "kind" {
			kind = n.Content[i+1].Value
			if _, ok := kinds[kind]; !ok {
				return Spec{}, f.fail(n.Content[i+1], name, "kind", "unknown kind %q (known: %s, %s)", kind, KindChronicle, KindSearch)
			}
		}
	}
	if kind == "" {
		return Spec{}, f.fail(n, name, "kind", "is required (%s or %s)", KindSearch, KindChronicle)
	}
	m, err := f.mapping(n, name, "", kinds[kind])
	if err != nil {
		return Spec{}, err
	}
	spec := Spec{Name: name, Kind: kind, file: f.path, lines: map[string]int{}}
	for key, v := range m {
		spec.lines[key] = v.Line
	}
	if spec.Mask, spec.masker, err = f.mask(name, m["mask"]); err != nil {
		return Spec{}, err
	}
	switch kind {
	case KindSearch:
		spec.Search, err = f.search(name, n, m)
	case KindChronicle:
		spec.Chronicle, err = f.chronicle(name, m)
	}
	return spec, err
}

// mask reads a projection's masked paths (package mask); none without n.
func (f fileReader) mask(name string, n *yaml.Node) ([]string, *mask.Mask, error) {
	if n == nil {
		return nil, nil, nil
	}
	var paths []string
	if n.Kind != yaml.SequenceNode || n.Decode(&paths) != nil || len(paths) == 0 {
		return nil, nil, f.fail(n, name, "mask", `must list the paths of the fields to mask, e.g. [email, "address.*"]`)
	}
	m, err := mask.Compile(paths)
	if err != nil {
		return nil, nil, f.fail(n, name, "mask", "%s", err)
	}
	return paths, m, nil
}

// chronicle reads a chronicle's table; nil leaves the default.
func (f fileReader) chronicle(name string, m map[string]*yaml.Node) (*ChronicleSpec, error) {
	t, ok := m["table"]
	if !ok {
		return nil, nil
	}
	if !tableName.MatchString(t.Value) {
		return nil, f.fail(t, name, "table", "%q is not a table name (table or schema.table, unquoted)", t.Value)
	}
	return &ChronicleSpec{Table: t.Value}, nil
}

func (f fileReader) search(name string, n *yaml.Node, m map[string]*yaml.Node) (*SearchSpec, error) {
	s := &SearchSpec{MaxPayloadBytes: projection.MaxPayloadBytesDefault}
	engine, ok := m["engine"]
	if !ok {
		return nil, f.fail(n, name, "engine", "is required: the engine's urls and how to authenticate")
	}
	if err := f.engine(name, engine, s); err != nil {
		return nil, err
	}
	if s.Index = scalar(m["index"]); s.Index == "" {
		return nil, f.fail(n, name, "index", "is required: the alias the projection writes")
	}
	if !indexName.MatchString(s.Index) {
		return nil, f.fail(m["index"], name, "index", "%q is not an index name: lower case, no spaces or \\/*?\"<>|,#:, not starting with -, _ or +", s.Index)
	}
	if s.MappingFile = scalar(m["mapping_file"]); s.MappingFile != "" {
		var err error
		if s.Mapping, s.MappingDigest, err = readMappingFile(s.MappingFile); err != nil {
			return nil, f.fail(m["mapping_file"], name, "mapping_file", "%s", err)
		}
	}
	if s.SourceTable = scalar(m["source_table"]); s.SourceTable != "" && !tableName.MatchString(s.SourceTable) {
		return nil, f.fail(m["source_table"], name, "source_table", "%q is not a table name (table or schema.table, unquoted)", s.SourceTable)
	}
	if err := f.number(name, "max_payload_bytes", m["max_payload_bytes"], &s.MaxPayloadBytes, projection.MaxPayloadBytesRange); err != nil {
		return nil, err
	}
	if b, ok := m["bulk"]; ok {
		if err := f.bulk(name, b, &s.Bulk); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// bulk reads a search projection's sending settings.
func (f fileReader) bulk(name string, n *yaml.Node, b *BulkSpec) error {
	m, err := f.mapping(n, name, "bulk", bulkKeys)
	if err != nil {
		return err
	}
	return bounds.First(f.number(name, "bulk.actions", m["actions"], &b.Actions, projection.BulkActionsRange),
		f.number(name, "bulk.bytes", m["bytes"], &b.Bytes, projection.BulkBytesRange),
		f.number(name, "bulk.concurrency", m["concurrency"], &b.Concurrency, projection.BulkConcurrencyRange))
}

// number reads a whole number within r into dst; nothing when n is nil.
func (f fileReader) number(name, key string, n *yaml.Node, dst *int, r bounds.Range[int]) error {
	if n == nil {
		return nil
	}
	if err := n.Decode(dst); err != nil {
		return f.fail(n, name, key, "must be a whole number")
	}
	if err := bounds.Check(key, *dst, r); err != nil {
		return f.fail(n, name, key, "%s", err)
	}
	return nil
}

var (
	indexName = regexp.MustCompile(`^[a-z0-9][^A-Z \\/*?"<>|,#:]{0,254}$`)
	tableName = regexp.MustCompile(`^([a-z_][a-z0-9_$]*\.)?[a-z_][a-z0-9_$]*$`)
)

func scalar(n *yaml.Node) string {
	if n == nil || n.Kind != yaml.ScalarNode {
		return ""
	}
	return n.Value
}

// readMappingFile reads the body wlproj creates the index with, and its
// digest; it says why path is not one: unreadable, or not a JSON object.
func readMappingFile(path string) (map[string]any, string, error) {
	body, err := os.ReadFile(path)
	if err != nil {
		return nil, "", fmt.Errorf("%s cannot be read: %s", path, unwrapPath(err))
	}
	var v map[string]any
	if err := jsonUnmarshal(body, &v); err != nil || v == nil {
		return nil, "", fmt.Errorf("%s is not a JSON object (the body of a create-index request)", path)
	}
	sum := sha256.Sum256(body)
	return v, hex.EncodeToString(sum[:8]), nil
}

// urlOf checks one engine URL: http or https, a host, no credentials.
func urlOf(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("is not an http(s) URL with a host")
	}
	if u.User != nil {
		return fmt.Errorf("carries credentials: name them with username and password_env or password_file instead")
	}
	return nil
}

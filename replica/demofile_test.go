package replica

import (
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The files make demo runs (scripts/demo.sh): its projections file, the
// mapping files it names and the workload it loads, from the repository's
// root, to which the file's mapping paths are relative.
const (
	demoProjections = "testdata/demo/projections.yaml"
	demoWorkload    = "testdata/demo_workload.sql"
)

// The demo's projections file loads as run would load it, each search
// projection's mapping is strict and maps exactly the fields the workload's
// documents of that projection carry, and every projection the workload
// writes is in the file, but for the one the demo shows failing as
// unknown_projection. A field added to the workload and not to its mapping
// would fail every document as mapping_error, which only the demo's end
// would show.
func TestDemoProjectionsFile(t *testing.T) {
	t.Chdir("..")
	specs, err := LoadProjections(demoProjections, func(string) string { return "" })
	require.NoError(t, err)
	require.Equal(t, []string{"blocks", "books", "chronicle"}, specs.Names())
	chronicle, ok := specs.Chronicle()
	require.True(t, ok)
	require.Equal(t, "chronicle", chronicle, "the name the workload writes")

	workload, err := os.ReadFile(demoWorkload)
	require.NoError(t, err)
	fields, written := demoDocumentFields(t, string(workload))
	for _, p := range written {
		require.True(t, specs.Known(p) || p == "wordcount", "%s writes projection %q, which %s lacks", demoWorkload, p, demoProjections)
	}

	aliases := map[string]string{"books": "demo-books", "blocks": "demo-blocks"}
	for _, s := range specs {
		if s.Kind != KindSearch {
			continue
		}
		require.Equal(t, aliases[s.Name], s.Search.Index, "scripts/demo.sh counts and cleans up these aliases")
		require.Equal(t, "testdata/demo/"+s.Name+"-mapping.json", s.Search.MappingFile)
		mappings, ok := s.Search.Mapping["mappings"].(map[string]any)
		require.True(t, ok, "%s: a mappings object", s.Search.MappingFile)
		require.Equal(t, "strict", mappings["dynamic"], "%s: strict, so that the demo's bad-strict book fails", s.Search.MappingFile)
		props, ok := mappings["properties"].(map[string]any)
		require.True(t, ok, "%s: a properties object", s.Search.MappingFile)
		require.NotEmpty(t, fields[s.Name], "%s writes no document of %s", demoWorkload, s.Name)
		require.ElementsMatch(t, fields[s.Name], slices.Sorted(maps.Keys(props)),
			"%s maps the fields the %s documents of %s carry, no more, no fewer", s.Search.MappingFile, s.Name, demoWorkload)
	}
	// The demo's deliberate failures stay failures.
	books, blocks := specs[slices.IndexFunc(specs, func(s Spec) bool { return s.Name == "books" })].Search,
		specs[slices.IndexFunc(specs, func(s Spec) bool { return s.Name == "blocks" })].Search
	require.NotContains(t, books.Mapping["mappings"].(map[string]any)["properties"], "colour", "bad-strict's field")
	position := blocks.Mapping["mappings"].(map[string]any)["properties"].(map[string]any)["position"].(map[string]any)
	require.Equal(t, "integer", position["type"], "bad-type's position is \"third\"")
}

var (
	// insertInto is an INSERT's column list; the first must be projection.
	insertInto = regexp.MustCompile(`(?s)^INSERT INTO outbox_events \(([^)]*)\)`)
	// projectionOf is the projection of a SELECT, or of each VALUES row.
	projectionOf = regexp.MustCompile(`(?m)(?:^SELECT |^\s*\()'([a-z][a-z0-9_-]*)',`)
)

// demoDocumentFields reads the workload's INSERTs: the keys of the
// jsonb_build_object payloads of each projection, sorted, and the
// projections written. Payloads written as JSON literals are the bad ones
// and are left out.
func demoDocumentFields(t *testing.T, sql string) (map[string][]string, []string) {
	t.Helper()
	fields := map[string][]string{}
	var written []string
	for _, stmt := range sqlStatements(sql) {
		m := insertInto.FindStringSubmatch(stmt)
		require.NotNil(t, m, "%s: a statement that is not an INSERT INTO outbox_events: %s", demoWorkload, stmt)
		require.True(t, strings.HasPrefix(m[1], "projection,"),
			"%s: an INSERT that names no projection writes the default one, which the demo's file lacks: %s", demoWorkload, stmt)
		rows := projectionOf.FindAllStringSubmatch(stmt, -1)
		require.NotEmpty(t, rows, "%s: no projection found in %s", demoWorkload, stmt)
		for _, r := range rows {
			if !slices.Contains(written, r[1]) {
				written = append(written, r[1])
			}
		}
		if len(rows) != 1 {
			continue // several VALUES rows, each with its JSON literal
		}
		p := rows[0][1]
		for _, key := range buildObjectKeys(t, stmt) {
			if !slices.Contains(fields[p], key) {
				fields[p] = append(fields[p], key)
			}
		}
		slices.Sort(fields[p])
	}
	return fields, written
}

// sqlStatements splits sql at semicolons outside string literals, leaving
// out comment lines and psql's backslash commands.
func sqlStatements(sql string) []string {
	var lines []string
	for _, l := range strings.Split(sql, "\n") {
		if trimmed := strings.TrimSpace(l); strings.HasPrefix(trimmed, "--") || strings.HasPrefix(trimmed, `\`) {
			continue
		}
		lines = append(lines, l)
	}
	var stmts []string
	var cur strings.Builder
	quoted := false
	for _, r := range strings.Join(lines, "\n") {
		switch {
		case r == '\'':
			quoted = !quoted // '' inside a literal toggles twice
		case r == ';' && !quoted:
			if s := strings.TrimSpace(cur.String()); s != "" {
				stmts = append(stmts, s)
			}
			cur.Reset()
			continue
		}
		cur.WriteRune(r)
	}
	return stmts
}

// buildObjectKeys are the keys of every jsonb_build_object call in stmt:
// its arguments at even positions, each a string literal.
func buildObjectKeys(t *testing.T, stmt string) []string {
	t.Helper()
	var keys []string
	const call = "jsonb_build_object("
	for rest := stmt; ; {
		i := strings.Index(rest, call)
		if i < 0 {
			return keys
		}
		rest = rest[i+len(call):]
		args := topLevelArgs(rest)
		require.Zero(t, len(args)%2, "jsonb_build_object with an odd number of arguments in %s", stmt)
		for j := 0; j < len(args); j += 2 {
			k := strings.TrimSpace(args[j])
			require.Regexp(t, `^'[a-z_]+'$`, k, "a jsonb_build_object key that is not a literal in %s", stmt)
			keys = append(keys, strings.Trim(k, "'"))
		}
	}
}

// topLevelArgs splits s, which follows a call's opening parenthesis, into
// the call's arguments, up to its closing parenthesis.
func topLevelArgs(s string) []string {
	var args []string
	depth, quoted, start := 0, false, 0
	for i, r := range s {
		switch {
		case r == '\'':
			quoted = !quoted
		case quoted:
		case r == '(':
			depth++
		case r == ')' && depth > 0:
			depth--
		case r == ')':
			return append(args, s[start:i])
		case r == ',' && depth == 0:
			args = append(args, s[start:i])
			start = i + 1
		}
	}
	return args
}

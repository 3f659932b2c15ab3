package mask

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

func TestCompileRefusesBadPaths(t *testing.T) {
	for path, problem := range map[string]string{
		"":           "is empty",
		" ":          "is empty",
		"a..b":       "empty segment",
		".a":         "empty segment",
		"a.":         "empty segment",
		"address.a*": "* stands alone",
		"**":         "* stands alone",
		"a. b":       "spaces",
	} {
		_, err := Compile([]string{"email", path})
		require.Error(t, err, path)
		require.Contains(t, err.Error(), problem, path)
		require.Contains(t, err.Error(), fmt.Sprintf("%q", path))
	}
	m, err := Compile(nil)
	require.NoError(t, err)
	require.True(t, m.Empty())
}

func TestPayloadMasksLeavesKeepingStructure(t *testing.T) {
	m, err := Compile([]string{"email", "address.*", "contacts.phone", "tags"})
	require.NoError(t, err)
	in := `{"title":"Dune","email":"a@b.c","address":{"city":"Paris","geo":{"lat":48.8}},"zip":"75001",
		"contacts":[{"phone":"555","name":"Ann"},[{"phone":12}]],"tags":["x","y"],"nested":{"email":"kept"}}`
	out, err := m.Payload([]byte(in))
	require.NoError(t, err)
	var got map[string]any
	require.NoError(t, json.Unmarshal(out, &got))
	require.Equal(t, map[string]any{
		"title": "Dune", "email": Marker, "zip": "75001",
		"address":  map[string]any{"city": Marker, "geo": map[string]any{"lat": Marker}},
		"contacts": []any{map[string]any{"phone": Marker, "name": "Ann"}, []any{map[string]any{"phone": Marker}}},
		"tags":     []any{Marker, Marker},
		"nested":   map[string]any{"email": "kept"}, // paths start at the root
	}, got)
}

func TestPayloadRefusesNotJSON(t *testing.T) {
	m, _ := Compile([]string{"email"})
	_, err := m.Payload([]byte(`{"email":`))
	require.Error(t, err)
	require.NotContains(t, m.Text([]byte(`{"email":`), "value secret"), "secret")
}

func TestTextRedactsEveryForm(t *testing.T) {
	m, _ := Compile([]string{"email", "age", "address"})
	payload := `{"email":"ann \"<x>\" é@b.c","age":1e3,"address":{"street":"Rue Oberkampf","n":true},"title":"Dune"}`
	for _, text := range []string{
		`failed to parse field [email] of type [long]. Preview of field's value: 'ann "<x>" é@b.c'`,
		`{"reason":"ann \"\u003cx\u003e\" é@b.c"}`,
		`{"reason":"ann \"<x>\" \u00e9@b.c"}`,
		`{"reason":"ann \"<x>\" \u00E9@b.c"}`,
		`value 1000.0 out of range`,
		`value 1000 out of range`,
		`street Rue Oberkampf refused`,
		`cut short: Rue Oberk…`,
	} {
		got := m.Text([]byte(payload), text)
		for _, secret := range []string{"é@b.c", "u00e9@b.c", "u00E9@b.c", "1000", "Oberk"} {
			require.NotContains(t, got, secret, text)
		}
		require.Contains(t, got, Marker, text)
	}
	require.Equal(t, "title Dune stays", m.Text([]byte(payload), "title Dune stays"))
}

// TestMarkerNeverSurvives is the property: a random marker planted in a
// masked field of a random payload survives neither Payload nor Text of
// any text that quotes it in any of the forms an engine prints.
func TestMarkerNeverSurvives(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	for i := range 2000 {
		marker := randomMarker(r)
		paths, payload := randomPayload(r, marker)
		m, err := Compile(paths)
		require.NoError(t, err)
		body, err := json.Marshal(payload)
		require.NoError(t, err)
		out, err := m.Payload(body)
		require.NoError(t, err)
		require.NotContains(t, string(out), marker, "case %d: %s", i, body)
		for _, text := range quotings(marker) {
			require.NotContains(t, m.Text(body, text), marker, "case %d: %s in %q", i, body, text)
		}
	}
}

func FuzzText(f *testing.F) {
	f.Add("s3cr3t-value", "Preview of field's value: '%s'", 40)
	f.Add(`q"uo\te<>é`, `{"error":{"reason":"%s"}}`, 3)
	f.Fuzz(func(t *testing.T, secret, format string, cut int) {
		// A payload is jsonb, valid UTF-8: json.Marshal would change an
		// invalid secret before it is masked.
		if !utf8.ValidString(secret) || len(secret) < cutPrefixMin || !strings.Contains(format, "%s") || strings.Contains(Marker, secret) {
			t.Skip()
		}
		m, _ := Compile([]string{"a.*"})
		body, _ := json.Marshal(map[string]any{"a": map[string]any{"b": secret}})
		text := strings.Replace(format, "%s", secret, 1)
		got := m.Text(body, text)
		if strings.Contains(got, secret) && !strings.Contains(strings.ReplaceAll(text, secret, ""), secret) {
			t.Fatalf("%q survives in %q", secret, got)
		}
	})
}

func randomMarker(r *rand.Rand) string {
	const alphabet = `abcdefghijklmnopqrstuvwxyz0123456789"\<>&éü `
	runes := []rune(alphabet)
	var b strings.Builder
	b.WriteString("MK")
	for range 6 + r.IntN(10) {
		b.WriteRune(runes[r.IntN(len(runes))])
	}
	return b.String()
}

// randomPayload nests marker under a random path of objects and arrays,
// beside unmasked siblings, and returns a path set that masks it (its
// path, a * of one of its levels, or a prefix of it).
func randomPayload(r *rand.Rand, marker string) ([]string, map[string]any) {
	keys := []string{"email", "address", "city", "contacts", "x"}
	depth := 1 + r.IntN(4)
	var segs []string
	var leaf any = marker
	if r.IntN(3) == 0 {
		leaf = map[string]any{"deep": []any{marker, 1}}
	}
	for range depth {
		segs = append(segs, keys[r.IntN(len(keys))])
	}
	v := leaf
	for i := depth - 1; i >= 0; i-- {
		if r.IntN(3) == 0 {
			v = []any{v, "sibling"}
		}
		v = map[string]any{segs[i]: v, "other": "visible"}
	}
	path := append([]string{}, segs...)
	switch r.IntN(3) {
	case 0:
		path[r.IntN(len(path))] = "*"
	case 1:
		path = path[:1+r.IntN(len(path))]
	}
	return []string{"unrelated.field", strings.Join(path, ".")}, v.(map[string]any)
}

// quotings are the forms an engine's error may quote a value in.
func quotings(s string) []string {
	j, _ := json.Marshal(s)
	return []string{
		"Preview of field's value: '" + s + "'",
		`{"reason":` + string(j) + `}`,
		fmt.Sprintf("For input string: %q", s),
		"ascii: " + strconv.QuoteToASCII(s),
	}
}

// BenchmarkTextManyLeaves is the worst case the loop meets: a failed
// event's payload with 10,000 masked values and an error text at
// classify's bound.
func BenchmarkTextManyLeaves(b *testing.B) {
	items := make([]any, 10_000)
	for i := range items {
		items[i] = map[string]any{"email": fmt.Sprintf("user%d@example.org", i), "n": i}
	}
	body, _ := json.Marshal(map[string]any{"contacts": items})
	m, _ := Compile([]string{"contacts.*"})
	text := strings.Repeat("failed to parse field [contacts.n] of type [long] ", 10)[:500] + "user9999@exam…"
	b.ResetTimer()
	for range b.N {
		if strings.Contains(m.Text(body, text), "user9999@exam") {
			b.Fatal("the cut value survives")
		}
	}
}

// BenchmarkTextTypical is a failed event of a few masked fields.
func BenchmarkTextTypical(b *testing.B) {
	body := []byte(`{"title":"Dune","email":"ann@example.org","address":{"street":"Rue Oberkampf","city":"Paris","zip":75011}}`)
	m, _ := Compile([]string{"email", "address.*"})
	text := "elasticsearch 400 mapper_parsing_exception: failed to parse field [address.zip] of type [long] in document with id 'book:1'. Preview of field's value: 'Rue Oberkampf'"
	for range b.N {
		m.Text(body, text)
	}
}

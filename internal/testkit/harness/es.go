package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// ES sends one request to the engine at base and decodes a 2xx answer into
// out (if not nil); any other status is an error quoting the engine. base
// may list several nodes, comma-separated (ELASTIC_URL of an ENGINE_NODES
// stack): the request goes to the first that accepts the connection.
func ES(ctx context.Context, base, method, path string, body []byte, out any) error {
	var resp *http.Response
	nodes := strings.Split(base, ",")
	for i, node := range nodes {
		req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(strings.TrimSpace(node), "/")+path, bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		if resp, err = http.DefaultClient.Do(req); err == nil {
			break
		}
		if i == len(nodes)-1 || !errors.Is(err, syscall.ECONNREFUSED) || ctx.Err() != nil {
			return err
		}
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		return &StatusError{Request: method + " " + path, Code: resp.StatusCode, Body: string(bytes.TrimSpace(data))}
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}

// StatusError is an engine answer other than 2xx.
type StatusError struct {
	Request string
	Code    int
	Body    string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("%s: %d %s: %s", e.Request, e.Code, http.StatusText(e.Code), e.Body)
}

// CreateIndex creates name with testdata/mapping.json, the strict mapping
// the demo's books and blocks fit.
func CreateIndex(ctx context.Context, base, name string) error {
	mapping, err := testdata("mapping.json")
	if err != nil {
		return err
	}
	if err := ES(ctx, base, http.MethodPut, "/"+name, mapping, nil); err != nil {
		return fmt.Errorf("create index %s: %w", name, err)
	}
	return nil
}

// DeleteIndex deletes the indices; missing ones are no error.
// A name that is an alias (a rebuild turns the index into one) deletes the
// indices behind it, and the rebuild's timestamped ones (name-*) too. The
// names are resolved to concrete indices first: Elasticsearch 8 refuses a
// delete by wildcard (action.destructive_requires_name).
func DeleteIndex(ctx context.Context, base string, names ...string) error {
	var patterns []string
	for _, name := range names {
		patterns = append(patterns, name, name+"-*")
	}
	var found map[string]json.RawMessage
	err := ES(ctx, base, http.MethodGet, "/"+strings.Join(patterns, ",")+
		"/_settings/index.uuid?ignore_unavailable=true&allow_no_indices=true&expand_wildcards=all", nil, &found)
	if err != nil || len(found) == 0 {
		return err
	}
	indexes := slices.Sorted(maps.Keys(found))
	return ES(ctx, base, http.MethodDelete, "/"+strings.Join(indexes, ",")+"?ignore_unavailable=true", nil, nil)
}

// DocCount refreshes index, so every acked write is visible, and counts
// its documents.
func DocCount(ctx context.Context, base, index string) (int, error) {
	if err := ES(ctx, base, http.MethodPost, "/"+index+"/_refresh", nil, nil); err != nil {
		return 0, err
	}
	var c struct {
		Count int `json:"count"`
	}
	err := ES(ctx, base, http.MethodGet, "/"+index+"/_count", nil, &c)
	return c.Count, err
}

// NewIndexName is an index name of the test's own; the index, if the test
// creates it, is deleted when the test ends.
func NewIndexName(t testing.TB) string {
	t.Helper()
	name := UniqueName("wlproj-t-")
	base := ElasticURL(t)
	t.Cleanup(func() { _ = DeleteIndex(context.Background(), base, name) })
	return name
}

// NewIndex is CreateIndex for tests: an index of the test's own with the
// strict mapping, deleted when the test ends.
func NewIndex(t testing.TB) string {
	t.Helper()
	name := NewIndexName(t)
	require.NoError(t, CreateIndex(context.Background(), ElasticURL(t), name))
	return name
}

// ForgetDeletes makes the engine lose every delete's version in index, as
// index.gc_deletes (60 s) or a node restart would; a canary deleted at
// version 2 that then takes version 1 proves it. Nothing may be in flight:
// with gc_deletes at zero, two bulks side by side could reorder a delete and
// an older upsert of one document, which the engine's 60 s cover in
// production.
func ForgetDeletes(ctx context.Context, base, index string, timeout time.Duration) error {
	path := "/" + index
	canary := path + "/_doc/harness:canary"
	es := func(ctx context.Context, method, path, body string) error {
		return ES(ctx, base, method, path, []byte(body), nil)
	}
	if err := es(ctx, http.MethodPut, canary+"?version=2&version_type=external_gte", `{"kind": "canary"}`); err != nil {
		return err
	}
	if err := es(ctx, http.MethodDelete, canary+"?version=2&version_type=external_gte", ""); err != nil {
		return err
	}
	restore := `{"index": {"gc_deletes": null}}`
	defer func() { _ = es(context.WithoutCancel(ctx), http.MethodPut, path+"/_settings", restore) }()
	err := Poll(ctx, timeout, "the engine to forget its deletes", func(ctx context.Context) (bool, error) {
		// Refresh and flush prune deletes older than gc_deletes; one younger
		// than the engine's clock tick (200 ms) waits for the next round.
		for _, req := range [][3]string{
			{http.MethodPut, path + "/_settings", `{"index": {"gc_deletes": "0s"}}`},
			{http.MethodPost, path + "/_refresh", ""},
			{http.MethodPost, path + "/_flush", ""},
			{http.MethodPut, path + "/_settings", restore},
		} {
			if err := es(ctx, req[0], req[1], req[2]); err != nil {
				return false, err
			}
		}
		err := es(ctx, http.MethodPut, canary+"?version=1&version_type=external_gte", `{"kind": "canary"}`)
		if se := (*StatusError)(nil); errors.As(err, &se) && se.Code == http.StatusConflict {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		return err
	}
	return es(ctx, http.MethodDelete, canary, "")
}

// DeletesForgotten is ForgetDeletes for tests.
func DeletesForgotten(t testing.TB, index string) {
	t.Helper()
	require.NoError(t, ForgetDeletes(context.Background(), ElasticURL(t), index, 30*time.Second))
}

// MappedTypes is the type field has in the mapping of each concrete index
// that index (an alias or a name) resolves to, "" where it is unmapped.
func MappedTypes(ctx context.Context, base, index, field string) (map[string]string, error) {
	var mapping map[string]struct {
		Mappings struct {
			Properties map[string]struct {
				Type string `json:"type"`
			} `json:"properties"`
		} `json:"mappings"`
	}
	if err := ES(ctx, base, http.MethodGet, "/"+index+"/_mapping", nil, &mapping); err != nil {
		return nil, err
	}
	types := map[string]string{}
	for concrete, m := range mapping {
		types[concrete] = m.Mappings.Properties[field].Type
	}
	return types, nil
}

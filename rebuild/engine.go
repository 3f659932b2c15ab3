package rebuild

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"

	"github.com/olivere/elastic/v7"

	"github.com/wlproj/wlproj/classify"
	"github.com/wlproj/wlproj/projection"
)

// engine is what a rebuild asks of Elasticsearch, through the daemon's
// client (projection.NewElasticClient).
type engine struct {
	client *elastic.Client
}

func (e engine) do(ctx context.Context, method, path string, body any, out any) error {
	resp, err := e.client.PerformRequest(ctx, elastic.PerformRequestOptions{Method: method, Path: path, Body: body})
	if err != nil {
		return err
	}
	if out != nil {
		return json.Unmarshal(resp.Body, out)
	}
	return nil
}

// named is what a name stands for in the engine.
type named struct {
	// Indexes are the indexes an alias points at; for a concrete index,
	// the index itself.
	Indexes  []string
	Concrete bool
}

// resolve says whether name is an alias (and of which indexes), a concrete
// index, or nothing.
func (e engine) resolve(ctx context.Context, name string) (named, error) {
	var byIndex map[string]any
	err := e.do(ctx, http.MethodGet, "/_alias/"+url.PathEscape(name), nil, &byIndex)
	if err == nil {
		var n named
		for index := range byIndex {
			n.Indexes = append(n.Indexes, index)
		}
		sort.Strings(n.Indexes)
		return n, nil
	}
	if !elastic.IsNotFound(err) {
		return named{}, fmt.Errorf("look up alias %s: %w", name, err)
	}
	exists, err := e.exists(ctx, name)
	if err != nil || !exists {
		return named{}, err
	}
	return named{Indexes: []string{name}, Concrete: true}, nil
}

func (e engine) exists(ctx context.Context, index string) (bool, error) {
	resp, err := e.client.PerformRequest(ctx, elastic.PerformRequestOptions{
		Method: http.MethodHead, Path: "/" + url.PathEscape(index), IgnoreErrors: []int{http.StatusNotFound}})
	if err != nil {
		return false, fmt.Errorf("look up index %s: %w", index, err)
	}
	return resp.StatusCode == http.StatusOK, nil
}

// copiedSettings are the index settings a new index takes from the one it
// replaces; the rest (uuid, creation date, routing, blocks) belong to that
// index alone.
var copiedSettings = []string{"number_of_shards", "number_of_replicas", "analysis", "similarity", "mapping",
	"max_result_window", "max_inner_result_window", "codec", "sort", "gc_deletes", "refresh_interval"}

// indexBody is the create-index body of index's mappings and the settings
// worth copying.
func (e engine) indexBody(ctx context.Context, index string) (map[string]any, error) {
	var mappings map[string]struct {
		Mappings map[string]any `json:"mappings"`
	}
	if err := e.do(ctx, http.MethodGet, "/"+url.PathEscape(index)+"/_mapping", nil, &mappings); err != nil {
		return nil, fmt.Errorf("read the mapping of %s: %w", index, err)
	}
	var settings map[string]struct {
		Settings struct {
			Index map[string]any `json:"index"`
		} `json:"settings"`
	}
	if err := e.do(ctx, http.MethodGet, "/"+url.PathEscape(index)+"/_settings", nil, &settings); err != nil {
		return nil, fmt.Errorf("read the settings of %s: %w", index, err)
	}
	copied := map[string]any{}
	for _, k := range copiedSettings {
		if v, ok := settings[index].Settings.Index[k]; ok {
			copied[k] = v
		}
	}
	return map[string]any{"settings": map[string]any{"index": copied}, "mappings": mappings[index].Mappings}, nil
}

// withoutRefresh returns body with refreshes off, as a bulk load wants:
// the rebuild refreshes once, before the swap.
func withoutRefresh(body map[string]any) map[string]any {
	return projection.WithRefreshIntervalOf(body, "-1")
}

func (e engine) create(ctx context.Context, index string, body map[string]any) error {
	return e.do(ctx, http.MethodPut, "/"+url.PathEscape(index), body, nil)
}

// setRefresh sets index.refresh_interval; nil restores the default.
func (e engine) setRefresh(ctx context.Context, index string, interval any) error {
	body := map[string]any{"index": map[string]any{"refresh_interval": interval}}
	if err := e.do(ctx, http.MethodPut, "/"+url.PathEscape(index)+"/_settings", body, nil); err != nil {
		return fmt.Errorf("set refresh_interval of %s: %w", index, err)
	}
	return nil
}

func (e engine) refreshInterval(ctx context.Context, index string) (any, error) {
	var s map[string]struct {
		Settings map[string]any `json:"settings"`
	}
	path := "/" + url.PathEscape(index) + "/_settings/index.refresh_interval?flat_settings=true"
	if err := e.do(ctx, http.MethodGet, path, nil, &s); err != nil {
		return nil, fmt.Errorf("read refresh_interval of %s: %w", index, err)
	}
	return s[index].Settings["index.refresh_interval"], nil
}

func (e engine) refresh(ctx context.Context, index string) error {
	if err := e.do(ctx, http.MethodPost, "/"+url.PathEscape(index)+"/_refresh", nil, nil); err != nil {
		return fmt.Errorf("refresh %s: %w", index, err)
	}
	return nil
}

func (e engine) count(ctx context.Context, index string) (int64, error) {
	var c struct {
		Count int64 `json:"count"`
	}
	err := e.do(ctx, http.MethodGet, "/"+url.PathEscape(index)+"/_count", nil, &c)
	return c.Count, err
}

// swap points alias at target in one _aliases call, which the engine
// applies atomically: readers see the old index or the new one, never
// neither. The removal of the old name is a compare-and-set (must_exist,
// or remove_index for a concrete index): if the alias moved since the
// rebuild opened, the call fails and changes nothing.
func (e engine) swap(ctx context.Context, r *Row) error {
	add := map[string]any{"add": map[string]any{"index": r.Target, "alias": r.Alias}}
	actions := []any{add}
	switch {
	case r.OldIsConcrete:
		actions = append(actions, map[string]any{"remove_index": map[string]any{"index": r.Alias}})
	case r.OldIndex != "":
		actions = append([]any{map[string]any{"remove": map[string]any{
			"index": r.OldIndex, "alias": r.Alias, "must_exist": true}}}, actions...)
	}
	if err := e.do(ctx, http.MethodPost, "/_aliases", map[string]any{"actions": actions}, nil); err != nil {
		return fmt.Errorf("swap alias %s to %s: %w", r.Alias, r.Target, err)
	}
	return nil
}

func (e engine) delete(ctx context.Context, index string) error {
	resp, err := e.client.PerformRequest(ctx, elastic.PerformRequestOptions{
		Method: http.MethodDelete, Path: "/" + url.PathEscape(index), IgnoreErrors: []int{http.StatusNotFound}})
	if err != nil {
		return fmt.Errorf("delete index %s: %w", index, err)
	}
	_ = resp
	return nil
}

// refusal turns the engine's answer to a create-index request into the
// operator's words: its reason, classified as the daemon would.
func refusal(err error) string {
	ce := classify.Classify(err)
	return strings.TrimPrefix(ce.Message, "elasticsearch ")
}

// rollback points alias back at the old index in one _aliases call, a
// compare-and-set like swap: it fails and changes nothing unless the alias
// is on the rebuild's index.
func (e engine) rollback(ctx context.Context, r *Row) error {
	actions := []any{
		map[string]any{"remove": map[string]any{"index": r.Target, "alias": r.Alias, "must_exist": true}},
		map[string]any{"add": map[string]any{"index": r.OldIndex, "alias": r.Alias}},
	}
	if err := e.do(ctx, http.MethodPost, "/_aliases", map[string]any{"actions": actions}, nil); err != nil {
		return fmt.Errorf("move alias %s back to %s: %w", r.Alias, r.OldIndex, err)
	}
	return nil
}

// Stored is a document as an index holds it: its external version and,
// when asked for, its _source.
type Stored struct {
	Version int64
	Source  json.RawMessage
}

func (e engine) mget(ctx context.Context, index string, ids []string, source bool) (map[string]Stored, error) {
	return MGet(ctx, e.client, index, ids, source)
}

// MGet reads the documents of ids that index has now, with their _source
// when source is set: _mget is real time, so a write acked a moment ago
// counts. The rebuild copies and checks documents with it, and verify's
// check again reads the index with it.
func MGet(ctx context.Context, client *elastic.Client, index string, ids []string, source bool) (map[string]Stored, error) {
	var a struct {
		Docs []struct {
			ID      string          `json:"_id"`
			Found   bool            `json:"found"`
			Version int64           `json:"_version"`
			Source  json.RawMessage `json:"_source"`
			Error   json.RawMessage `json:"error"`
		} `json:"docs"`
	}
	params := url.Values{"realtime": {"true"}, "_source": {fmt.Sprint(source)},
		"filter_path": {"docs._id,docs.found,docs._version,docs._source,docs.error"}}
	resp, err := client.PerformRequest(ctx, elastic.PerformRequestOptions{Method: http.MethodPost,
		Path: "/" + url.PathEscape(index) + "/_mget", Params: params, Body: map[string]any{"ids": ids}})
	if err == nil {
		err = json.Unmarshal(resp.Body, &a)
	}
	if err != nil {
		return nil, fmt.Errorf("get %d documents from %s: %w", len(ids), index, err)
	}
	out := make(map[string]Stored, len(ids))
	for _, d := range a.Docs {
		if len(d.Error) > 0 {
			return nil, fmt.Errorf("get %s from %s: %s", d.ID, index, d.Error)
		}
		if d.Found {
			out[d.ID] = Stored{Version: d.Version, Source: d.Source}
		}
	}
	return out, nil
}

package verify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/olivere/elastic/v7"

	"github.com/wlproj/wlproj/rebuild"
)

// engine reads one index (or alias) with requests that every engine of the
// matrix answers alike: a scroll in _doc order, an ids query and _mget,
// each with _source off and versions on, trimmed by filter_path.
type engine struct {
	client *elastic.Client
	index  string
}

// hit is one index document: its _id and external version.
type hit struct {
	ID      string `json:"_id"`
	Version int64  `json:"_version"`
}

// searchAnswer is a search or scroll answer after filter_path; hits is
// absent from an empty page.
type searchAnswer struct {
	ScrollID string `json:"_scroll_id"`
	TimedOut bool   `json:"timed_out"`
	Shards   struct {
		Failed int `json:"failed"`
	} `json:"_shards"`
	Hits struct {
		Hits []hit `json:"hits"`
	} `json:"hits"`
}

const searchFilter = "_scroll_id,timed_out,_shards.failed,hits.hits._id,hits.hits._version"

// check refuses an answer that may lack documents: a shard that failed or
// a timeout would make documents look missing.
func (a searchAnswer) check(what string) error {
	if a.Shards.Failed > 0 || a.TimedOut {
		return fmt.Errorf("%s: %d shards failed (timed out: %v); the answer may lack documents", what, a.Shards.Failed, a.TimedOut)
	}
	return nil
}

func (e engine) do(ctx context.Context, method, path string, params url.Values, body any, out any) error {
	resp, err := e.client.PerformRequest(ctx, elastic.PerformRequestOptions{Method: method, Path: path, Params: params, Body: body})
	if err != nil {
		var ee *elastic.Error
		if errors.As(err, &ee) && ee.Status == http.StatusNotFound && ee.Details != nil && ee.Details.Type == "index_not_found_exception" {
			return fmt.Errorf("index %s does not exist (ELASTIC_INDEX)", e.index)
		}
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	return json.Unmarshal(resp.Body, out)
}

// scroll hands every document of the index to each, a page at a time, in
// _doc order: the cheapest order, and one every engine allows (sorting on
// _id is refused by Elasticsearch 8). The scroll is a point-in-time view.
func (e engine) scroll(ctx context.Context, size int, each func([]hit) error) error {
	var a searchAnswer
	params := url.Values{"scroll": {scrollKeepAlive}, "filter_path": {searchFilter}}
	body := map[string]any{"size": size, "sort": []string{"_doc"}, "_source": false, "version": true}
	if err := e.do(ctx, http.MethodPost, "/"+url.PathEscape(e.index)+"/_search", params, body, &a); err != nil {
		return fmt.Errorf("scroll %s: %w", e.index, err)
	}
	defer func() {
		if a.ScrollID != "" {
			_, _ = e.client.PerformRequest(context.WithoutCancel(ctx), elastic.PerformRequestOptions{Method: http.MethodDelete,
				Path: "/_search/scroll", Body: map[string]any{"scroll_id": []string{a.ScrollID}}, IgnoreErrors: []int{http.StatusNotFound}})
		}
	}()
	for {
		if err := a.check("scroll " + e.index); err != nil {
			return err
		}
		if len(a.Hits.Hits) == 0 {
			return nil
		}
		if err := each(a.Hits.Hits); err != nil {
			return err
		}
		id := a.ScrollID
		a = searchAnswer{}
		err := e.do(ctx, http.MethodPost, "/_search/scroll", url.Values{"filter_path": {searchFilter}},
			map[string]any{"scroll": scrollKeepAlive, "scroll_id": id}, &a)
		if a.ScrollID == "" {
			a.ScrollID = id // cleared by the deferred call
		}
		if err != nil {
			return fmt.Errorf("scroll %s: %w", e.index, err)
		}
	}
}

// search returns the versions of those of ids the index has, as a search
// sees them (refreshed writes only); the check again reads in real time.
func (e engine) search(ctx context.Context, ids []string) (map[string]int64, error) {
	var a searchAnswer
	body := map[string]any{"size": len(ids), "query": map[string]any{"ids": map[string]any{"values": ids}},
		"_source": false, "version": true, "track_total_hits": false}
	if err := e.do(ctx, http.MethodPost, "/"+url.PathEscape(e.index)+"/_search", url.Values{"filter_path": {searchFilter}}, body, &a); err != nil {
		return nil, fmt.Errorf("look up %d ids in %s: %w", len(ids), e.index, err)
	}
	if err := a.check("look up ids in " + e.index); err != nil {
		return nil, err
	}
	out := make(map[string]int64, len(a.Hits.Hits))
	for _, h := range a.Hits.Hits {
		out[h.ID] = h.Version
	}
	return out, nil
}

// get returns the versions of those of ids the index has now: _mget is
// real time, so a write acked a moment ago counts.
func (e engine) get(ctx context.Context, ids []string) (map[string]int64, error) {
	docs, err := rebuild.MGet(ctx, e.client, e.index, ids, false)
	if err != nil {
		return nil, err
	}
	out := make(map[string]int64, len(docs))
	for id, d := range docs {
		out[id] = d.Version
	}
	return out, nil
}

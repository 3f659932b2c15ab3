// Package verify checks the never-lose-an-event rule after a test, drill or
// demo: every event is done or failed with a reason, and every document is at
// the newest version its done events carry (or gone, if that was a delete).
package verify

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Report is what Check found.
type Report struct {
	Events              int64    `json:"events"`
	Done                int64    `json:"done"`
	Failed              int64    `json:"failed"`
	FailedWithoutReason int64    `json:"failed_without_reason"`
	Lost                int64    `json:"lost"` // neither done nor failed
	Entities            int      `json:"entities"`
	Regressed           []string `json:"regressed,omitempty"` // document older than its newest done event
	Missing             []string `json:"missing,omitempty"`   // document absent though its newest done event is an upsert
	Resurrected         []string `json:"resurrected,omitempty"`
}

// OK is true when nothing was lost, regressed, missing or unexplained.
func (r Report) OK() bool {
	return r.Lost == 0 && r.FailedWithoutReason == 0 && len(r.Regressed) == 0 && len(r.Missing) == 0 && len(r.Resurrected) == 0
}

func (r Report) String() string {
	return fmt.Sprintf("events=%d done=%d failed=%d failed_without_reason=%d lost=%d entities=%d regressed=%d missing=%d resurrected=%d",
		r.Events, r.Done, r.Failed, r.FailedWithoutReason, r.Lost, r.Entities, len(r.Regressed), len(r.Missing), len(r.Resurrected))
}

const countsSQL = `
SELECT count(*), count(*) FILTER (WHERE status = 'done'), count(*) FILTER (WHERE status = 'failed'),
       count(*) FILTER (WHERE status = 'failed' AND coalesce(error_reason, '') = '')
  FROM outbox_events WHERE projection = 'search'`

// Entities with a failed event are left out of the version check: their
// newest event may be the one that failed.
const entitiesSQL = `
SELECT entity_type || ':' || entity_id,
       max(coalesce(event_version, id)),
       (array_agg(op ORDER BY coalesce(event_version, id) DESC, id DESC))[1]
  FROM outbox_events
 WHERE projection = 'search'
 GROUP BY entity_type, entity_id
HAVING bool_and(status = 'done')`

// Check compares the outbox with the index.
func Check(ctx context.Context, pool *pgxpool.Pool, elasticURL, index string) (Report, error) {
	var r Report
	if err := pool.QueryRow(ctx, countsSQL).Scan(&r.Events, &r.Done, &r.Failed, &r.FailedWithoutReason); err != nil {
		return r, err
	}
	r.Lost = r.Events - r.Done - r.Failed

	docs, err := versions(ctx, elasticURL, index)
	if err != nil {
		return r, err
	}
	rows, err := pool.Query(ctx, entitiesSQL)
	if err != nil {
		return r, err
	}
	defer rows.Close()
	for rows.Next() {
		var id, op string
		var version int64
		if err := rows.Scan(&id, &version, &op); err != nil {
			return r, err
		}
		r.Entities++
		got, present := docs[id]
		switch {
		case op == "delete" && present:
			r.Resurrected = append(r.Resurrected, fmt.Sprintf("%s: deleted at %d, found at %d", id, version, got))
		case op == "upsert" && !present:
			r.Missing = append(r.Missing, fmt.Sprintf("%s: want version %d", id, version))
		case op == "upsert" && got != version:
			r.Regressed = append(r.Regressed, fmt.Sprintf("%s: want version %d, found %d", id, version, got))
		}
	}
	return r, rows.Err()
}

// versions reads every document's _version with a scroll.
func versions(ctx context.Context, base, index string) (map[string]int64, error) {
	out := map[string]int64{}
	// Search is near-real-time: refresh so every acked write is visible.
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/"+index+"/_refresh", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	resp.Body.Close()
	type page struct {
		ScrollID string `json:"_scroll_id"`
		Hits     struct {
			Hits []struct {
				ID      string `json:"_id"`
				Version int64  `json:"_version"`
			} `json:"hits"`
		} `json:"hits"`
	}
	body := `{"size":5000,"version":true,"_source":false,"query":{"match_all":{}}}`
	url := base + "/" + index + "/_search?scroll=1m"
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		var p page
		var raw bytes.Buffer
		_, _ = raw.ReadFrom(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusNotFound && len(out) == 0 {
			return out, nil // no index: nothing was ever written
		}
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("scroll %s: %s: %s", index, resp.Status, raw.String())
		}
		if err := json.Unmarshal(raw.Bytes(), &p); err != nil {
			return nil, err
		}
		if len(p.Hits.Hits) == 0 {
			return out, nil
		}
		for _, h := range p.Hits.Hits {
			out[h.ID] = h.Version
		}
		url = base + "/_search/scroll"
		b, _ := json.Marshal(map[string]string{"scroll": "1m", "scroll_id": p.ScrollID})
		body = string(b)
	}
}

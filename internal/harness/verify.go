package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// Verdict is what Verify found: the never-lose-an-event rule, checked.
type Verdict struct {
	Events              int64 `json:"events"`
	Done                int64 `json:"done"`
	Failed              int64 `json:"failed"`
	FailedWithoutReason int64 `json:"failed_without_reason"`
	// Lost events are neither done nor failed.
	Lost     int64 `json:"lost"`
	Entities int   `json:"entities"`
	// Regressed documents are older than their newest done event.
	Regressed []string `json:"regressed,omitempty"`
	// Missing documents are absent though their newest done event is an upsert.
	Missing []string `json:"missing,omitempty"`
	// Resurrected documents are present though their newest done event is a delete.
	Resurrected []string `json:"resurrected,omitempty"`
	// LedgerMismatch documents have no ledger entry, or one whose version or
	// deleted flag is not their newest done event's: the next replay of an
	// older event would then be sent, or a newer one dropped.
	LedgerMismatch []string `json:"ledger_mismatch,omitempty"`
}

// OK is true when nothing was lost, regressed, missing or unexplained, and
// the ledger agrees with the events.
func (v Verdict) OK() bool {
	return v.Lost == 0 && v.FailedWithoutReason == 0 && len(v.Regressed) == 0 && len(v.Missing) == 0 &&
		len(v.Resurrected) == 0 && len(v.LedgerMismatch) == 0
}

func (v Verdict) String() string {
	return fmt.Sprintf("events=%d done=%d failed=%d failed_without_reason=%d lost=%d entities=%d regressed=%d missing=%d resurrected=%d ledger_mismatch=%d",
		v.Events, v.Done, v.Failed, v.FailedWithoutReason, v.Lost, v.Entities,
		len(v.Regressed), len(v.Missing), len(v.Resurrected), len(v.LedgerMismatch))
}

const verifyCountsSQL = `
SELECT count(*), count(*) FILTER (WHERE status = 'done'), count(*) FILTER (WHERE status = 'failed'),
       count(*) FILTER (WHERE status = 'failed' AND coalesce(error_reason, '') = '')
  FROM outbox_events WHERE projection = 'search'`

// Entities with an event not done are left out of the version and ledger
// checks: their newest event may be the one that failed. Newest is by
// (version, outbox id), the ledger's order, superseded events included: the
// ledger is never behind a done event, whether it was sent or dropped. The
// ledger entry comes along, null if there is none.
const verifyEntitiesSQL = `
SELECT e.entity_type || ':' || e.entity_id, e.version, e.op, a.version, a.deleted
  FROM (SELECT entity_type, entity_id,
               max(coalesce(event_version, id)) AS version,
               (array_agg(op ORDER BY coalesce(event_version, id) DESC, id DESC))[1] AS op
          FROM outbox_events
         WHERE projection = 'search'
         GROUP BY entity_type, entity_id
        HAVING bool_and(status = 'done')) e
  LEFT JOIN outbox_applied a
    ON a.projection = 'search' AND a.entity_type = e.entity_type AND a.entity_id = e.entity_id`

// Verify compares the search projection's events in pool's database with
// the documents of index and the ledger: every event done or failed with a
// reason, every document at the newest version its done events carry, or
// gone if that was a delete, and its ledger entry at that version and op.
func Verify(ctx context.Context, pool *pgxpool.Pool, elasticURL, index string) (Verdict, error) {
	var v Verdict
	if err := pool.QueryRow(ctx, verifyCountsSQL).Scan(&v.Events, &v.Done, &v.Failed, &v.FailedWithoutReason); err != nil {
		return v, err
	}
	v.Lost = v.Events - v.Done - v.Failed
	docs, err := versions(ctx, elasticURL, index)
	if err != nil {
		return v, err
	}
	rows, err := pool.Query(ctx, verifyEntitiesSQL)
	if err != nil {
		return v, err
	}
	defer rows.Close()
	for rows.Next() {
		var id, op string
		var version int64
		var ledgerVersion *int64
		var ledgerDeleted *bool
		if err := rows.Scan(&id, &version, &op, &ledgerVersion, &ledgerDeleted); err != nil {
			return v, err
		}
		v.Entities++
		if m := ledgerMismatch(version, op, ledgerVersion, ledgerDeleted); m != "" {
			v.LedgerMismatch = append(v.LedgerMismatch, id+": "+m)
		}
		got, present := docs[id]
		switch {
		case op == "delete" && present:
			v.Resurrected = append(v.Resurrected, fmt.Sprintf("%s: deleted at %d, found at %d", id, version, got))
		case op == "upsert" && !present:
			v.Missing = append(v.Missing, fmt.Sprintf("%s: want version %d", id, version))
		case op == "upsert" && got != version:
			v.Regressed = append(v.Regressed, fmt.Sprintf("%s: want version %d, found %d", id, version, got))
		}
	}
	return v, rows.Err()
}

// ledgerMismatch says how a ledger entry differs from the newest done event,
// empty if it does not.
func ledgerMismatch(version int64, op string, ledgerVersion *int64, ledgerDeleted *bool) string {
	if ledgerVersion == nil {
		return fmt.Sprintf("want ledger at %d %s, found no entry", version, op)
	}
	gotOp := "upsert"
	if *ledgerDeleted {
		gotOp = "delete"
	}
	if *ledgerVersion != version || gotOp != op {
		return fmt.Sprintf("want ledger at %d %s, found %d %s", version, op, *ledgerVersion, gotOp)
	}
	return ""
}

// Verified is Verify for tests: it fails the test unless the verdict is OK.
func Verified(t testing.TB, pool *pgxpool.Pool, index string) Verdict {
	t.Helper()
	v, err := Verify(context.Background(), pool, ElasticURL(t), index)
	require.NoError(t, err)
	require.True(t, v.OK(), "%s\nregressed=%v missing=%v resurrected=%v ledger_mismatch=%v",
		v, v.Regressed, v.Missing, v.Resurrected, v.LedgerMismatch)
	return v
}

// versions reads every document's _version with a scroll; no index means
// nothing was ever written.
func versions(ctx context.Context, base, index string) (map[string]int64, error) {
	out := map[string]int64{}
	// Search is near-real-time: refresh so every acked write is visible.
	if err := ES(ctx, base, http.MethodPost, "/"+index+"/_refresh", nil, nil); err != nil {
		if se := (*StatusError)(nil); errors.As(err, &se) && se.Code == http.StatusNotFound {
			return out, nil
		}
		return nil, err
	}
	var page struct {
		ScrollID string `json:"_scroll_id"`
		Hits     struct {
			Hits []struct {
				ID      string `json:"_id"`
				Version int64  `json:"_version"`
			} `json:"hits"`
		} `json:"hits"`
	}
	path, body := "/"+index+"/_search?scroll=1m", []byte(`{"size":5000,"version":true,"_source":false,"query":{"match_all":{}}}`)
	for {
		page.Hits.Hits = nil
		if err := ES(ctx, base, http.MethodPost, path, body, &page); err != nil {
			return nil, fmt.Errorf("scroll %s: %w", index, err)
		}
		if len(page.Hits.Hits) == 0 {
			return out, nil
		}
		for _, h := range page.Hits.Hits {
			out[h.ID] = h.Version
		}
		path = "/_search/scroll"
		body, _ = json.Marshal(map[string]string{"scroll": "1m", "scroll_id": page.ScrollID})
	}
}

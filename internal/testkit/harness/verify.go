package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// Verdict is what Verify found: the never-lose-an-event rule, checked.
type Verdict struct {
	Events              int64 `json:"events"`
	Done                int64 `json:"done"`
	Failed              int64 `json:"failed"`
	FailedWithoutReason int64 `json:"failed_without_reason"`
	// Discarded events were closed by an operator: neither lost nor applied.
	Discarded int64 `json:"discarded"`
	// Lost events are still pending or processing.
	Lost int64 `json:"lost"`
	// Entities are the documents judged: every one with an event.
	Entities int `json:"entities"`
	// Unexpected lists the failed events the caller did not expect, or
	// expected with another reason, as "event ID failed as REASON".
	Unexpected []string `json:"failed_unexpected,omitempty"`
	// Regressed documents are older than their newest done event.
	Regressed []string `json:"regressed,omitempty"`
	// Missing documents are absent though their newest done event is an upsert.
	Missing []string `json:"missing,omitempty"`
	// Resurrected documents are present though their newest done event is a
	// delete, or though none of their events is done.
	Resurrected []string `json:"resurrected,omitempty"`
	// LedgerMismatch documents have no ledger entry, or one whose version or
	// deleted flag is not their newest done event's (or any entry without a
	// done event): the next replay of an older event would then be sent, or
	// a newer one dropped.
	LedgerMismatch []string `json:"ledger_mismatch,omitempty"`
}

// OK is true when nothing was lost, regressed, missing or unexplained, no
// event failed that was not expected to, and the ledger agrees with the
// events.
func (v Verdict) OK() bool {
	return v.Lost == 0 && v.FailedWithoutReason == 0 && len(v.Unexpected) == 0 && len(v.Regressed) == 0 &&
		len(v.Missing) == 0 && len(v.Resurrected) == 0 && len(v.LedgerMismatch) == 0
}

func (v Verdict) String() string {
	return fmt.Sprintf("events=%d done=%d failed=%d failed_without_reason=%d failed_unexpected=%d discarded=%d lost=%d entities=%d regressed=%d missing=%d resurrected=%d ledger_mismatch=%d",
		v.Events, v.Done, v.Failed, v.FailedWithoutReason, len(v.Unexpected), v.Discarded, v.Lost, v.Entities,
		len(v.Regressed), len(v.Missing), len(v.Resurrected), len(v.LedgerMismatch))
}

// Failure is a failed event a verdict accepts: its outbox id and the
// reason (error_reason) it must have failed with. It is allowed, not
// required: a refused event that a newer one made obsolete may end done.
type Failure struct {
	ID     int64
	Reason string
}

// ExpectFailed is the events of db's search projection matching where
// (SQL on outbox_events), each expected to fail with reason.
func ExpectFailed(t testing.TB, db DB, reason, where string, args ...any) []Failure {
	t.Helper()
	ids := Column[int64](t, db, `SELECT id FROM outbox_events WHERE projection = 'search' AND (`+where+`) ORDER BY id`, args...)
	require.NotEmpty(t, ids, "no event matches %s", where)
	return Map(ids, func(id int64) Failure { return Failure{ID: id, Reason: reason} })
}

// verifySource is where a verdict reads: events, a relation with
// outbox_event_states' columns (the outbox's view, or ArchivedEventStates
// of a rotating run), and dropped, a query of each document's newest
// ledger entry the rotation dropped, as (entity_type, entity_id, version,
// deleted, aged_secs: its age when dropped, archived_at), with rotation
// the settings it was dropped under.
type verifySource struct {
	events   string
	dropped  string
	rotation *Rotation
}

// outboxSource is the outbox as it is: no row was ever rotated away.
var outboxSource = verifySource{events: "outbox_event_states", dropped: `
  SELECT NULL::text AS entity_type, NULL::text AS entity_id, NULL::bigint AS version, NULL::boolean AS deleted,
         NULL::float8 AS aged_secs, NULL::timestamptz AS archived_at WHERE false`}

const verifyCountsSQL = `
SELECT count(*), count(*) FILTER (WHERE status = 'done'), count(*) FILTER (WHERE status = 'failed'),
       count(*) FILTER (WHERE status = 'failed' AND coalesce(error_reason, '') = ''),
       count(*) FILTER (WHERE status = 'discarded'),
       count(*) FILTER (WHERE status IN ('pending', 'processing'))
  FROM %s WHERE projection = 'search'`

const verifyFailedSQL = `
SELECT id, coalesce(error_reason, '') FROM %s
 WHERE projection = 'search' AND status = 'failed' ORDER BY id`

// Every document with an event is judged against its newest applicable
// event: the newest done one by (version, outbox id), the ledger's order,
// superseded events included, whether they were sent or dropped. Failed
// and discarded events apply nothing; a pending or processing one is lost,
// counted above. A document with no done event has a null version and op.
// The ledger entry comes along, null if there is none; then the entry the
// rotation dropped (%[2]s), and whether an event of the document that
// ended failed or discarded was written before that drop.
const verifyEntitiesSQL = `
WITH docs AS (
  SELECT DISTINCT entity_type, entity_id FROM %[1]s WHERE projection = $1
), newest AS (
  SELECT DISTINCT ON (entity_type, entity_id) entity_type, entity_id, coalesce(event_version, id) AS version, op
    FROM %[1]s
   WHERE projection = $1 AND status = 'done'
   ORDER BY entity_type, entity_id, coalesce(event_version, id) DESC, id DESC
), unsent AS (
  SELECT entity_type, entity_id, min(created_at) AS first_written FROM %[1]s
   WHERE projection = $1 AND status IN ('failed', 'discarded')
   GROUP BY entity_type, entity_id
), dropped AS (%[2]s
)
SELECT d.entity_type || ':' || d.entity_id, n.version, n.op, a.version, a.deleted,
       x.version, x.deleted, x.aged_secs, coalesce(u.first_written < x.archived_at, false)
  FROM docs d
  LEFT JOIN newest n ON n.entity_type = d.entity_type AND n.entity_id = d.entity_id
  LEFT JOIN unsent u ON u.entity_type = d.entity_type AND u.entity_id = d.entity_id
  LEFT JOIN LATERAL outbox_ledger_entry($1, d.entity_type, d.entity_id) a ON true
  LEFT JOIN dropped x ON x.entity_type = d.entity_type AND x.entity_id = d.entity_id`

// Verify compares the search projection's events in pool's database with
// the documents of index and the ledger: no event pending or processing,
// every failed one among expected with its reason, every document at the
// version of its newest done event, or gone if that was a delete or if none
// is done, and its ledger entry at that version and op. It assumes every
// event is still in outbox_events: run it before retention rotates any, or
// use VerifyRotated.
func Verify(ctx context.Context, pool *pgxpool.Pool, elasticURL, index string, expected ...Failure) (Verdict, error) {
	return VerifyProjection(ctx, pool, elasticURL, index, "search", expected...)
}

// VerifyProjection is Verify of the named search projection's documents
// in index; the counts and failures are of every projection's events.
func VerifyProjection(ctx context.Context, pool *pgxpool.Pool, elasticURL, index, projection string, expected ...Failure) (Verdict, error) {
	return verifyFrom(ctx, pool, elasticURL, index, projection, outboxSource, expected...)
}

// verifyFrom is VerifyProjection reading from src.
func verifyFrom(ctx context.Context, pool *pgxpool.Pool, elasticURL, index, projection string, src verifySource,
	expected ...Failure) (Verdict, error) {
	var v Verdict
	if err := pool.QueryRow(ctx, fmt.Sprintf(verifyCountsSQL, src.events)).Scan(&v.Events, &v.Done, &v.Failed,
		&v.FailedWithoutReason, &v.Discarded, &v.Lost); err != nil {
		return v, err
	}
	if err := v.judgeFailures(ctx, pool, src, expected); err != nil {
		return v, err
	}
	docs, err := versions(ctx, elasticURL, index)
	if err != nil {
		return v, err
	}
	rows, err := pool.Query(ctx, fmt.Sprintf(verifyEntitiesSQL, src.events, src.dropped), projection)
	if err != nil {
		return v, err
	}
	defer rows.Close()
	for rows.Next() {
		var e entityRow
		if err := rows.Scan(&e.id, &e.version, &e.op, &e.ledgerVersion, &e.ledgerDeleted,
			&e.droppedVersion, &e.droppedDeleted, &e.droppedAgedSecs, &e.unsentBeforeDrop); err != nil {
			return v, err
		}
		v.judge(e, docs, src.rotation)
	}
	return v, rows.Err()
}

// entityRow is one row of verifyEntitiesSQL.
type entityRow struct {
	id                     string
	version, ledgerVersion *int64
	op                     *string
	ledgerDeleted          *bool
	droppedVersion         *int64
	droppedDeleted         *bool
	droppedAgedSecs        *float64
	unsentBeforeDrop       bool
}

// judge adds what is wrong with one document to the verdict: the index
// against its newest done event, and its ledger entry (or, under rot, the
// entry the rotation dropped legitimately) against the same.
func (v *Verdict) judge(e entityRow, docs map[string]int64, rot *Rotation) {
	v.Entities++
	got, present := docs[e.id]
	if e.version == nil {
		if present {
			v.Resurrected = append(v.Resurrected, fmt.Sprintf("%s: no event done, found at %d", e.id, got))
		}
		if e.ledgerVersion != nil {
			v.LedgerMismatch = append(v.LedgerMismatch, fmt.Sprintf("%s: want no ledger entry, found %d %s",
				e.id, *e.ledgerVersion, opOf(*e.ledgerDeleted)))
		}
		return
	}
	if m := e.ledgerMismatch(rot); m != "" {
		v.LedgerMismatch = append(v.LedgerMismatch, e.id+": "+m)
	}
	switch version, op := *e.version, *e.op; {
	case op == "delete" && present:
		v.Resurrected = append(v.Resurrected, fmt.Sprintf("%s: deleted at %d, found at %d", e.id, version, got))
	case op == "upsert" && !present:
		v.Missing = append(v.Missing, fmt.Sprintf("%s: want version %d", e.id, version))
	case op == "upsert" && got != version:
		v.Regressed = append(v.Regressed, fmt.Sprintf("%s: want version %d, found %d", e.id, version, got))
	}
}

// ledgerMismatch says how the document's ledger differs from its newest
// done event, empty if it does not. A document with no entry left is
// judged, under a rotation, by the newest entry the rotation dropped, if
// the drop was legitimate (droppedLegitimately): the leader then holds no
// entry for it, as designed, and the dropped one must have been its newest
// done event's.
func (e entityRow) ledgerMismatch(rot *Rotation) string {
	if e.ledgerVersion != nil || rot == nil || e.droppedVersion == nil {
		return ledgerMismatch(*e.version, *e.op, e.ledgerVersion, e.ledgerDeleted)
	}
	dropped := fmt.Sprintf("%d %s", *e.droppedVersion, opOf(*e.droppedDeleted))
	if why := e.droppedTooEarly(*rot); why != "" {
		return fmt.Sprintf("want ledger at %d %s, found no entry: the rotation dropped %s %s", *e.version, *e.op, dropped, why)
	}
	if m := ledgerMismatch(*e.version, *e.op, e.droppedVersion, e.droppedDeleted); m != "" {
		return m + " (dropped by the rotation)"
	}
	return ""
}

// droppedTooEarly says why the rotation should have kept the document's
// entry it dropped, empty if the drop was legitimate. The ledger's rotation
// (outbox.RotateLedger) carries a document's newest entry into the current
// partition while it is younger than the retention (the tombstone
// retention for a delete: it refuses an older upsert written after the
// delete) or while an event of the document could still be sent. The
// verdict sees the latter as an event that ended failed or discarded and
// was written before the drop; an event pending then and done since wrote
// an entry of its own after the drop, which is then the document's entry
// and judged as any. (An event whose transaction began before the drop and
// committed after it is judged by the retentions alone by the rotation, so
// it would show here as an early drop; no drill writes one that fails.)
func (e entityRow) droppedTooEarly(rot Rotation) string {
	keep := rot.Retention
	if *e.droppedDeleted {
		keep = rot.TombstoneRetention
	}
	aged := time.Duration(*e.droppedAgedSecs * float64(time.Second))
	switch {
	case aged < keep:
		return fmt.Sprintf("%s after it was applied, within its retention of %s", aged.Round(time.Millisecond), keep)
	case e.unsentBeforeDrop:
		return "while an event of the document written before the drop could still be sent (it ended failed or discarded)"
	}
	return ""
}

// judgeFailures lists the failed events that expected does not name with
// their reason.
func (v *Verdict) judgeFailures(ctx context.Context, pool *pgxpool.Pool, src verifySource, expected []Failure) error {
	want := make(map[int64]string, len(expected))
	for _, f := range expected {
		want[f.ID] = f.Reason
	}
	rows, err := pool.Query(ctx, fmt.Sprintf(verifyFailedSQL, src.events))
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		var reason string
		if err := rows.Scan(&id, &reason); err != nil {
			return err
		}
		if r, ok := want[id]; !ok || r != reason || reason == "" {
			v.Unexpected = append(v.Unexpected, fmt.Sprintf("event %d failed as %q", id, reason))
		}
	}
	return rows.Err()
}

func opOf(deleted bool) string {
	if deleted {
		return "delete"
	}
	return "upsert"
}

// ledgerMismatch says how a ledger entry differs from the newest done event,
// empty if it does not.
func ledgerMismatch(version int64, op string, ledgerVersion *int64, ledgerDeleted *bool) string {
	if ledgerVersion == nil {
		return fmt.Sprintf("want ledger at %d %s, found no entry", version, op)
	}
	if gotOp := opOf(*ledgerDeleted); *ledgerVersion != version || gotOp != op {
		return fmt.Sprintf("want ledger at %d %s, found %d %s", version, op, *ledgerVersion, gotOp)
	}
	return ""
}

// Verified is Verify for tests: it fails the test unless the verdict is OK.
func Verified(t testing.TB, pool *pgxpool.Pool, index string, expected ...Failure) Verdict {
	t.Helper()
	return VerifiedProjection(t, pool, index, "search", expected...)
}

// VerifiedProjection is VerifyProjection for tests, on the stack's engine.
func VerifiedProjection(t testing.TB, pool *pgxpool.Pool, index, projection string, expected ...Failure) Verdict {
	t.Helper()
	return VerifiedProjectionOn(t, pool, ElasticURL(t), index, projection, expected...)
}

// VerifiedProjectionOn is VerifyProjection for tests, on the engine at
// elasticURL.
func VerifiedProjectionOn(t testing.TB, pool *pgxpool.Pool, elasticURL, index, projection string, expected ...Failure) Verdict {
	t.Helper()
	v, err := VerifyProjection(context.Background(), pool, elasticURL, index, projection, expected...)
	require.NoError(t, err)
	require.True(t, v.OK(), "%s\nfailed_unexpected=%v regressed=%v missing=%v resurrected=%v ledger_mismatch=%v",
		v, v.Unexpected, v.Regressed, v.Missing, v.Resurrected, v.LedgerMismatch)
	return v
}

// VersionPage is one page of a scroll over an index's ids and versions.
type VersionPage struct {
	ScrollID string `json:"_scroll_id"`
	Hits     struct {
		Hits []struct {
			ID      string `json:"_id"`
			Version int64  `json:"_version"`
		} `json:"hits"`
	} `json:"hits"`
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
	var page VersionPage
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

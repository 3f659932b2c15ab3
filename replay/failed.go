package replay

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/policy"
)

// Filter selects failed rows, or archived ones. Zero fields do not filter;
// set fields combine with AND.
type Filter struct {
	Projection string
	Reason     string
	// Since (inclusive) and Until (exclusive) bound the time of failure, the
	// row's updated_at.
	Since, Until time.Time
	EntityType   string
	ScopeKey     string
	// Class is the error_class: transient or deterministic.
	Class string
	// Text matches rows whose last_error contains it, ignoring case.
	Text string
	// Limit caps List; zero lists every match. Stats ignores it.
	Limit int
	// Archived reads the dead letter (outbox_dead_letter) instead of the
	// failed rows of outbox_events.
	Archived bool
	// Allowed holds every read and action to the rows the reader's grants
	// allow (policy.Grants.Allowed); nil: every row.
	Allowed *policy.Allowed
}

// FailedEvent is a failed row as triage sees it.
type FailedEvent struct {
	ID          int64     `json:"id"`
	Projection  string    `json:"projection"`
	EntityType  string    `json:"entity_type"`
	EntityID    string    `json:"entity_id"`
	Op          string    `json:"op"`
	Attempts    int       `json:"attempts"`
	ErrorReason string    `json:"error_reason"`
	ErrorClass  string    `json:"error_class"`
	LastError   string    `json:"last_error"` // the first 300 characters
	UpdatedAt   time.Time `json:"updated_at"` // time of failure
	ReplayCount int       `json:"replay_count"`
	ScopeKey    string    `json:"scope_key"`
	// Status is failed or discarded; for an archived row, as it was archived.
	Status string `json:"status"`
	// ArchivedAt is set for a row of the dead letter.
	ArchivedAt time.Time `json:"archived_at,omitzero"`
}

// Stat counts the failed rows of one projection and reason.
type Stat struct {
	Projection string    `json:"projection"`
	Reason     string    `json:"reason"`
	Class      string    `json:"class"`
	Count      int64     `json:"count"`
	Oldest     time.Time `json:"oldest"`
	Newest     time.Time `json:"newest"`
}

// filterWhere is shared by listing, stats, paging and every action, with
// the parameters $1 projection, $2 reason, $3 since, $4 until, $5
// entity_type, $6 scope_key, $7 error_class, $8 text in last_error, each
// NULL when not filtering, and $9 and $10 the pairs of LIKE patterns of
// projection and scope key the reader's grants allow (policy.Allowed),
// NULL for every row: what a person filters by narrows what their grants
// allow, never widens it. The text is escaped, so that % and _ in it are
// themselves, and matched as lower(last_error) LIKE, the form the trigram
// index outbox_events_failed_error_idx serves (migration 00008).
const filterWhere = `($1::text IS NULL OR projection = $1)
   AND ($2::text IS NULL OR error_reason = $2)
   AND ($3::timestamptz IS NULL OR updated_at >= $3)
   AND ($4::timestamptz IS NULL OR updated_at < $4)
   AND ($5::text IS NULL OR entity_type = $5)
   AND ($6::text IS NULL OR scope_key = $6)
   AND ($7::text IS NULL OR coalesce(error_class, '') = $7)
   AND ($8::text IS NULL OR lower(last_error) LIKE
        '%' || replace(replace(replace(lower($8), '\', '\\'), '%', '\%'), '_', '\_') || '%')
   AND ($9::text[] IS NULL OR EXISTS (SELECT 1 FROM unnest($9::text[], $10::text[]) AS allowed(p, s)
                                       WHERE projection LIKE allowed.p AND coalesce(scope_key, '') LIKE allowed.s))`

// filterParams is how many parameters filterWhere takes; a query's own
// come after them.
const filterParams = 10

// rowSet is the rows an action or a listing reads: a table, and the
// statuses in it that count. Its SQL is put together once, from the
// literals below only.
type rowSet struct {
	// want names the statuses in messages: "id 7 is done, not failed".
	want string
	// never, when set, says why requested rows of another status can never
	// be taken, in place of "is discarded, not ...": a discarded row stays
	// discarded, archived or not.
	never func(status string, ids []int64) string
	// unknown names an id that is not in the table: "unknown archived ids".
	unknown string
	// byIDs locks every requested row whatever its status, so missing and
	// unwanted ids can be reported; wanted and matches say why one is left.
	// readByIDs is the same without the lock, for a dry run.
	byIDs, readByIDs string
	// locked locks the wanted rows a filter matches, lowest id first; $11 is
	// the limit, NULL for all. lowest reads them without the lock.
	locked, lowest string
	// oldest locks the $11 wanted rows a filter matches that failed first:
	// a batch of a large selection, found by walking the partial indexes
	// of its statuses in the order of failure, where locked would read and
	// sort every match for each batch. page reads, without a lock, the $11
	// that failed first after the position ($12 the time of failure, $13
	// the id): a page of a dry run. Both empty for the dead letter.
	oldest, page string
	count        string
	// list is newest failure first: triage starts from what just broke.
	list  string
	stats string
	// cols and where are the listing's columns and the filter of the wanted
	// rows, from which query.go builds the keyset pages.
	table, cols, where string
}

// The status predicates are literals so that the planner can use the
// partial indexes (outbox_events_failed_idx, outbox_events_discarded_idx).
// Archive takes discarded rows too (housekeeping), and the dead letter keeps
// their status; a restore takes only the archived rows that were failed.
var (
	failedRows = withOldest(newRowSet("outbox_events", "NULL::timestamptz", "status = 'failed'", "failed", "unknown ids"),
		"failed")
	closedRows = withOldest(newRowSet("outbox_events", "NULL::timestamptz", "(status = 'failed' OR status = 'discarded')",
		"failed or discarded", "unknown ids"), "failed", "discarded")
	archivedRows   = newRowSet("outbox_dead_letter", "archived_at", "true", "archived", "unknown archived ids")
	restorableRows = func() rowSet {
		r := newRowSet("outbox_dead_letter", "archived_at", "status = 'failed'", "archived failed", "unknown archived ids")
		r.never = neverRevived
		return r
	}()
)

// neverRevived refuses archived rows that were discarded.
func neverRevived(status string, ids []int64) string {
	if status != outbox.StatusDiscarded {
		return ""
	}
	if len(ids) == 1 {
		return fmt.Sprintf("archived id %d was discarded; discarded events are never revived", ids[0])
	}
	return "archived ids " + FormatIDs(ids) + " were discarded; discarded events are never revived"
}

// rowCols are the columns a listing and an action read, statusCol the
// status they report. A listing carries only the start of last_error; the
// full text and the history stay in the row.
func rowCols(archivedAt, statusCol string) string {
	return `id, projection, entity_type, entity_id, op, attempts,
       coalesce(error_reason, ''), coalesce(error_class, ''),
       left(coalesce(last_error, ''), 300), updated_at, replay_count, coalesce(scope_key, ''),
       ` + statusCol + `, ` + archivedAt
}

// shownStatus is the status a refusal names for a row of table: a queued
// row's own status says only that it has a position, so the operator is
// told what outbox_event_states says it is (pending, processing or done),
// the status every other tool shows for it. The view is read only for the
// requested rows that are queued: never one an action takes.
func shownStatus(table string) string {
	if table != "outbox_events" {
		return "status"
	}
	return `CASE WHEN status = 'queued'
            THEN (SELECT s.status FROM outbox_event_states s WHERE s.id = outbox_events.id)
            ELSE status END`
}

func newRowSet(table, archivedAt, status, want, unknown string) rowSet {
	cols := rowCols(archivedAt, "status")
	where := status + "\n   AND " + filterWhere
	byIDs := `SELECT ` + rowCols(archivedAt, shownStatus(table)) + `, ` + status + ` AS wanted,
       coalesce(` + filterWhere + `, false) AS matches
  FROM ` + table + `
 WHERE id = ANY($11)
 ORDER BY id`
	lowest := `SELECT ` + cols + `
  FROM ` + table + `
 WHERE ` + where + `
 ORDER BY id
 LIMIT $11`
	return rowSet{
		want: want, unknown: unknown, table: table, cols: cols, where: where,
		byIDs: byIDs + "\n FOR UPDATE", readByIDs: byIDs,
		locked: lowest + "\n FOR UPDATE", lowest: lowest,
		count: `SELECT count(*) FROM ` + table + ` WHERE ` + where,
		list: `SELECT ` + cols + `
  FROM ` + table + `
 WHERE ` + where + `
 ORDER BY updated_at DESC, id DESC
 LIMIT $11`,
		stats: statsPageSQL(table, where),
	}
}

// statsPageSQL counts one page of the rows of table matching where, by
// projection and reason, with the page's last position: $11 and $12 are
// the position after which the page starts (the time of failure and the
// id; for the dead letter, whose page walks the primary key, the id alone
// counts), $13 the page's size. A page of the failed rows walks
// outbox_events_failed_time_idx.
func statsPageSQL(table, where string) string {
	key, after := "updated_at, id", "(updated_at, id) > ($11::timestamptz, $12::bigint)"
	if table == "outbox_dead_letter" {
		key, after = "id", "($11::timestamptz IS NOT NULL AND id > $12::bigint)"
	}
	last := func(col string) string {
		return `(SELECT ` + col + ` FROM page ORDER BY ` + strings.ReplaceAll(key, ",", " DESC,") + ` DESC LIMIT 1)`
	}
	return `WITH page AS MATERIALIZED (
  SELECT projection, error_reason, error_class, updated_at, id FROM ` + table + `
   WHERE ` + where + `
     AND ` + after + `
   ORDER BY ` + key + ` LIMIT $13)
SELECT projection, coalesce(error_reason, ''), coalesce(max(error_class), ''), count(*), min(updated_at), max(updated_at),
       ` + last("updated_at") + `, ` + last("id") + `
  FROM page
 GROUP BY 1, 2`
}

// withOldest adds r's oldest and page queries: one arm per status, each
// walking its partial index by time of failure (outbox_events_failed_time_idx,
// outbox_events_discarded_idx) and stopping at the limit.
func withOldest(r rowSet, statuses ...string) rowSet {
	firstFailed := func(after string) string {
		arms := make([]string, len(statuses))
		for i, st := range statuses {
			arms[i] = `(SELECT id, updated_at FROM ` + r.table + ` WHERE status = '` + st + `' AND ` + filterWhere + after + `
         ORDER BY updated_at, id LIMIT $11)`
		}
		return `SELECT ` + r.cols + `
  FROM ` + r.table + `
 WHERE id = ANY(ARRAY(SELECT id FROM (` + strings.Join(arms, "\n       UNION ALL ") + `) c
                       ORDER BY updated_at, id LIMIT $11))
   AND ` + r.where
	}
	r.oldest = firstFailed("") + `
 ORDER BY id
 FOR UPDATE`
	r.page = firstFailed(` AND (updated_at, id) > ($12::timestamptz, $13::bigint)`) + `
 ORDER BY updated_at, id`
	return r
}

func (f Filter) args() []any {
	return []any{nullString(f.Projection), nullString(f.Reason), nullTime(f.Since), nullTime(f.Until),
		nullString(f.EntityType), nullString(f.ScopeKey), nullString(f.Class), nullString(f.Text),
		f.Allowed.ProjectionsArg(), f.Allowed.ScopesArg()}
}

func (f Filter) rows() rowSet {
	if f.Archived {
		return archivedRows
	}
	return failedRows
}

// List returns failed (or archived) rows matching f, newest failure first,
// in one statement: with no Limit it reads every match at once, where
// ListPage reads a page per statement.
func List(ctx context.Context, db outbox.Querier, f Filter) ([]FailedEvent, error) {
	if f.Limit < 0 {
		return nil, bounds.Invalid("Limit", "must not be negative, got %d", f.Limit)
	}
	var limit any
	if f.Limit > 0 {
		limit = f.Limit
	}
	rows, err := db.Query(ctx, f.rows().list, append(f.args(), limit)...)
	if err != nil {
		return nil, fmt.Errorf("list failed events: %w", err)
	}
	events, err := pgx.CollectRows(rows, scanFailed)
	if err != nil {
		return nil, fmt.Errorf("list failed events: %w", err)
	}
	return events, nil
}

// statsPage is the rows one statement of Stats counts.
const statsPage = 20_000

// Stats counts failed (or archived) rows matching f by projection and
// reason, largest group first. It reads them a page per statement, so that
// no statement reads every failed row: counting 200,000 failed rows in one
// took 1.5 s, and the console's overview calls it.
func Stats(ctx context.Context, db outbox.Querier, f Filter) ([]Stat, error) {
	type group struct{ projection, reason string }
	groups := map[group]*Stat{}
	at, id := time.Unix(0, 0).UTC(), int64(0)
	for {
		rows, err := db.Query(ctx, f.rows().stats, append(f.args(), at, id, statsPage)...)
		if err != nil {
			return nil, fmt.Errorf("failed stats: %w", err)
		}
		var s Stat
		var read int64
		_, err = pgx.ForEachRow(rows, []any{&s.Projection, &s.Reason, &s.Class, &s.Count, &s.Oldest, &s.Newest, &at, &id}, func() error {
			read += s.Count
			g := groups[group{s.Projection, s.Reason}]
			if g == nil {
				g = &Stat{Projection: s.Projection, Reason: s.Reason, Oldest: s.Oldest}
				groups[group{s.Projection, s.Reason}] = g
			}
			g.Count += s.Count
			g.Class = max(g.Class, s.Class)
			g.Oldest, g.Newest = minTime(g.Oldest, s.Oldest), maxTime(g.Newest, s.Newest)
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("failed stats: %w", err)
		}
		if read < statsPage {
			break
		}
	}
	stats := make([]Stat, 0, len(groups))
	for _, g := range groups {
		stats = append(stats, *g)
	}
	slices.SortFunc(stats, func(a, b Stat) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Projection, b.Projection), cmp.Compare(a.Reason, b.Reason))
	})
	return stats, nil
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func scanFailed(r pgx.CollectableRow) (FailedEvent, error) { return scanEvent(r) }

// scanEvent reads the columns of a rowSet's listing, then more.
func scanEvent(r pgx.Row, more ...any) (FailedEvent, error) {
	var e FailedEvent
	var archivedAt *time.Time
	err := r.Scan(append([]any{&e.ID, &e.Projection, &e.EntityType, &e.EntityID, &e.Op, &e.Attempts,
		&e.ErrorReason, &e.ErrorClass, &e.LastError, &e.UpdatedAt, &e.ReplayCount, &e.ScopeKey,
		&e.Status, &archivedAt}, more...)...)
	if archivedAt != nil {
		e.ArchivedAt = *archivedAt
	}
	return e, err
}

func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func nullTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}

// NotAllowed are those of ids that allowed does not allow: ids of rows
// (failed or not; archived ones when archived) of another projection or
// scope, and ids of no row at all, which a person held to some scopes is
// told no more about than those; none for a nil allowed. An action checks
// its ids with it first, so that an id of another scope is refused as
// such, not left out as if a filter had skipped it.
func NotAllowed(ctx context.Context, db outbox.Querier, archived bool, ids []int64, allowed *policy.Allowed) ([]int64, error) {
	if allowed == nil || len(ids) == 0 {
		return nil, nil
	}
	table := "outbox_events"
	if archived {
		table = "outbox_dead_letter"
	}
	rows, err := db.Query(ctx, `SELECT id FROM `+table+` WHERE id = ANY($1) AND EXISTS (
		SELECT 1 FROM unnest($2::text[], $3::text[]) AS allowed(p, s)
		 WHERE projection LIKE allowed.p AND coalesce(scope_key, '') LIKE allowed.s)`,
		ids, allowed.Projections, allowed.Scopes)
	if err != nil {
		return nil, fmt.Errorf("check the ids against the policy: %w", err)
	}
	mine, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("check the ids against the policy: %w", err)
	}
	var outside []int64
	for _, id := range ids {
		if !slices.Contains(mine, id) && !slices.Contains(outside, id) {
			outside = append(outside, id)
		}
	}
	slices.Sort(outside)
	return outside, nil
}

package replay

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/outbox"
)

// The reads a person paging through failed rows needs beyond List and
// Stats: keyset pages in several orders, a count, and the reasons to filter
// by (one row whole is event.go's). The console uses them; the CLI may.

const (
	// PageSizeDefault is the rows of a Page when PageRequest.Size is zero.
	PageSizeDefault = 50
	// pageSizeMax bounds a page, so a request cannot ask for the table.
	pageSizeMax = 1000
)

// PageSizeRange is what PageRequest.Size accepts.
var PageSizeRange = bounds.Range[int]{Min: 1, Max: pageSizeMax}

// SortKey is a column a Page can be ordered by; ties go by id.
type SortKey string

// The orders of a Page.
const (
	SortFailedAt SortKey = "failed_at" // updated_at, the time of failure
	SortID       SortKey = "id"
	SortAttempts SortKey = "attempts"
	SortReplays  SortKey = "replays"
)

// SortKeys are the keys a Sort may name, in the order a form offers them.
var SortKeys = []SortKey{SortFailedAt, SortID, SortAttempts, SortReplays}

// sortColumns maps each key to its column and the type its cursor value is
// sent as.
var sortColumns = map[SortKey]struct{ col, typ string }{
	SortFailedAt: {"updated_at", "timestamptz"},
	SortID:       {"id", "bigint"},
	SortAttempts: {"attempts", "bigint"},
	SortReplays:  {"replay_count", "bigint"},
}

// Sort orders a Page by Key, largest (newest) first unless Asc.
type Sort struct {
	Key SortKey
	Asc bool
}

// SortDefault is newest failure first: triage starts from what just broke.
var SortDefault = Sort{Key: SortFailedAt}

// String is the form ParseSort reads: "failed_at" ascending, "-failed_at"
// descending.
func (s Sort) String() string {
	if s.Asc {
		return string(s.Key)
	}
	return "-" + string(s.Key)
}

// ParseSort reads a Sort written as String writes it; empty is SortDefault.
func ParseSort(v string) (Sort, error) {
	if v == "" {
		return SortDefault, nil
	}
	key, desc := strings.CutPrefix(v, "-")
	if _, ok := sortColumns[SortKey(key)]; !ok {
		names := make([]string, len(SortKeys))
		for i, k := range SortKeys {
			names[i] = string(k)
		}
		return Sort{}, fmt.Errorf("unknown sort %q: use one of %s, with - for descending", v, strings.Join(names, ", "))
	}
	return Sort{Key: SortKey(key), Asc: !desc}, nil
}

// Cursor is the position of a row in a Sort: its sort value (a failure time
// in Unix microseconds, Postgres' precision, or the integer) and its id.
type Cursor struct {
	Value, ID int64
}

// String is the form ParseCursor reads.
func (c Cursor) String() string {
	return strconv.FormatInt(c.Value, 10) + "." + strconv.FormatInt(c.ID, 10)
}

// ParseCursor reads a cursor written by Cursor.String.
func ParseCursor(v string) (Cursor, error) {
	a, b, ok := strings.Cut(v, ".")
	value, err1 := strconv.ParseInt(a, 10, 64)
	id, err2 := strconv.ParseInt(b, 10, 64)
	if !ok || err1 != nil || err2 != nil || id <= 0 {
		return Cursor{}, fmt.Errorf("malformed page cursor %q", v)
	}
	return Cursor{Value: value, ID: id}, nil
}

// cursor is e's position in s.
func (s Sort) cursor(e FailedEvent) Cursor {
	c := Cursor{ID: e.ID}
	switch s.Key {
	case SortFailedAt:
		c.Value = e.UpdatedAt.UnixMicro()
	case SortID:
		c.Value = e.ID
	case SortAttempts:
		c.Value = int64(e.Attempts)
	case SortReplays:
		c.Value = int64(e.ReplayCount)
	}
	return c
}

func (s Sort) arg(c Cursor) any {
	if s.Key == SortFailedAt {
		return time.UnixMicro(c.Value)
	}
	return c.Value
}

// PageRequest asks for one page of failed (or archived) rows.
type PageRequest struct {
	Filter Filter
	// Sort defaults to SortDefault.
	Sort Sort
	// After is the Next cursor of the page before; Before the Prev cursor of
	// the page after. At most one is set; neither is the first page.
	After, Before *Cursor
	// Size is the rows per page. Defaults to 50.
	Size int
}

// Page is a run of rows in the requested order, with the cursors of its
// neighbours: nil where there is nothing more in that direction (Prev may
// lead to an empty page when rows before it went away meanwhile).
type Page struct {
	Events     []FailedEvent
	Next, Prev *Cursor
}

// page directions: the first page, the one after a cursor, the one before.
const (
	pageFirst = iota
	pageAfter
	pageBefore
)

type pageKey struct {
	archived bool
	sort     Sort
	dir      int
}

// pageSQL holds every page query, put together once from the literals of
// the row sets and sortColumns: after the filter's parameters come the
// cursor (value, id), then the limit. Paging by keyset costs the same on
// the last page as on the first, where an OFFSET would read every row
// before it.
var pageSQL = func() map[pageKey]string {
	param := func(n int) string { return "$" + strconv.Itoa(filterParams+n) }
	m := map[pageKey]string{}
	for _, archived := range []bool{false, true} {
		rs := Filter{Archived: archived}.rows()
		for key, c := range sortColumns {
			for _, asc := range []bool{false, true} {
				for _, dir := range []int{pageFirst, pageAfter, pageBefore} {
					// A page before a cursor is read backwards, then reversed.
					forward := asc != (dir == pageBefore)
					cmp, order := "<", c.col+" DESC, id DESC"
					if forward {
						cmp, order = ">", c.col+", id"
					}
					where, limit := rs.where, param(1)
					if dir != pageFirst {
						where += "\n   AND (" + c.col + ", id) " + cmp + " (" + param(1) + "::" + c.typ + ", " + param(2) + "::bigint)"
						limit = param(3)
					}
					m[pageKey{archived, Sort{key, asc}, dir}] = `SELECT ` + rs.cols + `
  FROM ` + rs.table + `
 WHERE ` + where + `
 ORDER BY ` + order + `
 LIMIT ` + limit
				}
			}
		}
	}
	return m
}()

// ListPage reads one page of the rows matching req.Filter (whose Limit it
// ignores).
func ListPage(ctx context.Context, db outbox.Querier, req PageRequest) (Page, error) {
	if req.Sort == (Sort{}) {
		req.Sort = SortDefault
	}
	if req.Size == 0 {
		req.Size = PageSizeDefault
	}
	if err := bounds.Check("Size", req.Size, PageSizeRange); err != nil {
		return Page{}, err
	}
	if req.After != nil && req.Before != nil {
		return Page{}, bounds.Invalid("After", "and Before exclude each other")
	}
	dir, at := pageFirst, req.After
	switch {
	case req.After != nil:
		dir = pageAfter
	case req.Before != nil:
		dir, at = pageBefore, req.Before
	}
	sql, ok := pageSQL[pageKey{req.Filter.Archived, req.Sort, dir}]
	if !ok {
		return Page{}, bounds.Invalid("Sort", "unknown key %q", req.Sort.Key)
	}
	args := req.Filter.args()
	if at != nil {
		args = append(args, req.Sort.arg(*at), at.ID)
	}
	// One row past the page tells whether there is more.
	rows, err := db.Query(ctx, sql, append(args, req.Size+1)...)
	if err != nil {
		return Page{}, fmt.Errorf("page of failed events: %w", err)
	}
	events, err := pgx.CollectRows(rows, scanFailed)
	if err != nil {
		return Page{}, fmt.Errorf("page of failed events: %w", err)
	}
	more := len(events) > req.Size
	if more {
		events = events[:req.Size]
	}
	p := Page{Events: events}
	if dir == pageBefore {
		slices.Reverse(p.Events)
	}
	if len(p.Events) == 0 {
		return p, nil
	}
	first, last := req.Sort.cursor(p.Events[0]), req.Sort.cursor(p.Events[len(p.Events)-1])
	// Going forward, there is a page before unless this is the first; going
	// back, there is one after: the page the cursor came from.
	if (dir == pageBefore && more) || dir == pageAfter {
		p.Prev = &first
	}
	if (dir != pageBefore && more) || dir == pageBefore {
		p.Next = &last
	}
	return p, nil
}

// Count is the number of rows f matches (its Limit ignored).
func Count(ctx context.Context, db outbox.Querier, f Filter) (int64, error) {
	var n int64
	if err := db.QueryRow(ctx, f.rows().count, f.args()...).Scan(&n); err != nil {
		return 0, fmt.Errorf("count failed events: %w", err)
	}
	return n, nil
}

// reasonsSQL lists the distinct reasons of the failed rows by skipping
// through outbox_events_failed_idx, one probe per reason, so its cost
// follows the number of reasons, not of rows.
const reasonsSQL = `
WITH RECURSIVE r AS (
    (SELECT error_reason FROM outbox_events WHERE status = 'failed' ORDER BY error_reason LIMIT 1)
    UNION ALL
    SELECT (SELECT e.error_reason FROM outbox_events e
             WHERE e.status = 'failed' AND e.error_reason > r.error_reason
             ORDER BY e.error_reason LIMIT 1)
      FROM r WHERE r.error_reason IS NOT NULL)
SELECT error_reason FROM r WHERE error_reason IS NOT NULL`

// Reasons are the error reasons failed rows have now, sorted: the choices
// of a filter form, cheap at any number of failed rows (Stats counts them,
// and reads every row).
func Reasons(ctx context.Context, db outbox.Querier) ([]string, error) {
	rows, err := db.Query(ctx, reasonsSQL)
	if err != nil {
		return nil, fmt.Errorf("failed reasons: %w", err)
	}
	reasons, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("failed reasons: %w", err)
	}
	return reasons, nil
}

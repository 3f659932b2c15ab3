package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/wlproj/wlproj/leader"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/policy"
	"github.com/wlproj/wlproj/replay"
	"github.com/wlproj/wlproj/verify"
)

const (
	// chartWindow and chartBucket are the overview chart's hour in minutes.
	chartWindow = time.Hour
	chartBucket = time.Minute
	// stuckShown is how many stuck rows the overview lists.
	stuckShown = 20
)

type overviewView struct {
	Snapshot      outbox.Snapshot
	MaxProcessing time.Duration
	Replicas      []replicaRow
	Done, Failed  chart
	Stats         []replay.Stat
	Stuck         []outbox.StuckRow
	// Verify is each projection's last complete scheduled verify.
	Verify []verify.LastRun
	// Horizon is who holds the database's vacuum horizon, and the dead
	// rows of the outbox and the ledger.
	Horizon outbox.Horizon
	// Specs are how this replica builds each projection, and Agreement its
	// projections hash beside the leader's; nil without a hash.
	Specs     []ProjectionInfo
	Agreement *outbox.ProjectionsAgreement
	// Scoped is an actor who may not view every scope of every projection:
	// the counts over all scopes are not theirs to see.
	Scoped bool
}

type replicaRow struct {
	Name   string
	Leader bool
	This   bool
	Since  time.Time
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request) {
	if !seesEveryScope(grantsOf(r), c.deps.Projections) {
		c.scopedOverview(w, r)
		return
	}
	ctx := r.Context()
	v := overviewView{MaxProcessing: c.cfg.MaxProcessing}
	var err error
	v.Snapshot, err = outbox.TakeSnapshotWith(ctx, c.deps.Pool, outbox.SnapshotOptions{
		MaxProcessing: c.cfg.MaxProcessing, Projections: append([]string{}, c.deps.Projections...), Rebuilds: true})
	if err != nil {
		c.fail(w, r, err)
		return
	}
	sessions, err := outbox.Replicas(ctx, c.deps.Pool, c.deps.LeaderName)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	this := c.deps.State().WorkerID
	for _, s := range sessions {
		name := strings.TrimPrefix(s.ApplicationName, leader.LockSessionName(""))
		v.Replicas = append(v.Replicas, replicaRow{Name: name, Leader: s.Holding, This: name == this, Since: s.Since})
	}
	buckets, err := c.activityBuckets(ctx)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	v.Done, v.Failed = activityCharts(buckets)
	if v.Stats, err = replay.Stats(ctx, c.deps.Pool, replay.Filter{Allowed: viewAllowed(r)}); err != nil {
		c.fail(w, r, err)
		return
	}
	if v.Stuck, err = outbox.Stuck(ctx, c.deps.Pool, c.cfg.MaxProcessing, stuckShown); err != nil {
		c.fail(w, r, err)
		return
	}
	if v.Verify, err = verify.LastRuns(ctx, c.deps.Pool); err != nil {
		c.fail(w, r, err)
		return
	}
	if v.Horizon, err = c.deps.Horizon.Read(ctx, c.deps.Pool); err != nil {
		c.fail(w, r, err)
		return
	}
	if v.Agreement, err = c.projectionsAgreement(ctx); err != nil {
		c.fail(w, r, err)
		return
	}
	v.Specs = c.withWaiting(c.deps.ProjectionSpecs)
	c.render(w, r, http.StatusOK, "overview", "Overview", v)
}

// seesEveryScope reports whether g may view every scope of every
// projection: the counts over all scopes (lag, backlog, charts, stuck
// rows, verify's drift, the horizon) are shown only then.
func seesEveryScope(g *policy.Grants, projections []string) bool {
	for _, p := range projections {
		if !g.Whole(policy.View, p) {
			return false
		}
	}
	return true
}

// scopedOverview is the overview of an actor held to some scopes: the
// failed rows of those scopes by projection and reason.
func (c *Console) scopedOverview(w http.ResponseWriter, r *http.Request) {
	v := overviewView{Scoped: true}
	var err error
	if v.Stats, err = replay.Stats(r.Context(), c.deps.Pool, replay.Filter{Allowed: viewAllowed(r)}); err != nil {
		c.fail(w, r, err)
		return
	}
	c.render(w, r, http.StatusOK, "overview", "Overview", v)
}

// withWaiting is specs with why each projection's events wait, if they do.
func (c *Console) withWaiting(specs []ProjectionInfo) []ProjectionInfo {
	if c.deps.Waiting == nil {
		return specs
	}
	waiting := c.deps.Waiting()
	out := slices.Clone(specs)
	for i := range out {
		out[i].Waiting = waiting[out[i].Name]
	}
	return out
}

// projectionsAgreement sets this replica's projections hash beside the
// leader's, as /readyz does; nil when the replica gave none.
func (c *Console) projectionsAgreement(ctx context.Context) (*outbox.ProjectionsAgreement, error) {
	if c.deps.ProjectionsHash == "" {
		return nil, nil
	}
	a, err := outbox.CompareProjections(ctx, c.deps.Pool, c.deps.LeaderName, c.deps.ProjectionsHash)
	if err != nil {
		return nil, err
	}
	return &a, nil
}

// activityBuckets reads the chart's hour, or reuses the last read for a
// few seconds.
func (c *Console) activityBuckets(ctx context.Context) ([]outbox.Bucket, error) {
	a := &c.activity
	a.Lock()
	defer a.Unlock()
	if a.buckets != nil && time.Since(a.at) < activityTTL {
		return a.buckets, nil
	}
	b, err := outbox.Activity(ctx, c.deps.Pool, chartWindow, chartBucket)
	if err != nil {
		return nil, err
	}
	a.buckets, a.at = b, time.Now()
	return b, nil
}

type failedView struct {
	// Archived is the archived page: the dead letter's rows, to restore.
	Archived  bool
	Fields    []field
	Sort      field
	Typed     []field
	Filter    string
	HasFilter bool
	Count     int64
	Events    []replay.FailedEvent
	First     string
	Prev      string
	Next      string
	SortLinks map[string]string
	Max       int
	// Archivable says the filter is one archive selects by.
	Archivable bool
	// ArchiveBy names archive's filter fields.
	ArchiveBy string
}

func (c *Console) failed(w http.ResponseWriter, r *http.Request) { c.rows(w, r, false) }

func (c *Console) archived(w http.ResponseWriter, r *http.Request) { c.rows(w, r, true) }

// rows serves the failed page, or the archived page: the same filters,
// orders and pages, on the dead letter.
func (c *Console) rows(w http.ResponseWriter, r *http.Request, archived bool) {
	ctx := r.Context()
	raw := r.URL.Query()
	q, qerr := parseFailedQuery(raw, time.Now(), archived)
	name, title := "failed", "Failed events"
	choices := map[string][]string{"projection": grantsOf(r).Visible(policy.View, c.deps.Projections), "class": classes}
	if archived {
		// The reasons of the dead letter would take a scan of it: typed.
		name, title = "archived", "Archived events"
	} else {
		reasons, err := replay.Reasons(ctx, c.deps.Pool)
		if err != nil {
			c.fail(w, r, err)
			return
		}
		choices["reason"] = reasons
	}
	archiveBy := actionKinds["archive"].filters
	v := failedView{Archived: archived, Fields: filterForm(raw, choices), Sort: sortField(raw.Get("sort")),
		Max: replay.MaxDefault, ArchiveBy: strings.Join(labels(archiveBy), " and ")}
	if qerr != nil {
		// The form keeps what was typed, so the mistake can be mended.
		c.renderError(w, r, http.StatusBadRequest, name, title, v, qerr.Error())
		return
	}
	v.describeFilter(q.typed, archiveBy)
	q.filter.Allowed = viewAllowed(r)
	var err error
	if v.Count, err = replay.Count(ctx, c.deps.Pool, q.filter); err != nil {
		c.fail(w, r, err)
		return
	}
	page, err := replay.ListPage(ctx, c.deps.Pool, replay.PageRequest{Filter: q.filter, Sort: q.sort,
		After: q.after, Before: q.before, Size: q.size})
	if err != nil {
		c.fail(w, r, err)
		return
	}
	// A row that failed before its projection had a mask holds the quoted
	// value in its stored error: masked here, as the event page does.
	if err := replay.MaskLastErrors(ctx, c.deps.Pool, c.deps.Masks, page.Events); err != nil {
		c.fail(w, r, err)
		return
	}
	v.Events = page.Events
	v.links(q, page)
	c.render(w, r, http.StatusOK, name, title, v)
}

// describeFilter says what the typed filter selects, and whether archive
// could take it as it is.
func (v *failedView) describeFilter(typed typedFilter, archiveBy []string) {
	v.Archivable = true
	for f := range typed {
		if !slices.Contains(archiveBy, f) {
			v.Archivable = false
		}
	}
	for _, f := range filterFields {
		if s, ok := typed[f]; ok {
			v.Typed = append(v.Typed, field{Name: f, Value: s})
		}
	}
	v.Filter, v.HasFilter = typed.describe(), len(typed) > 0
}

// links are the page's: the first, previous and next pages, and each
// column's sort.
func (v *failedView) links(q failedQuery, page replay.Page) {
	if q.after != nil || q.before != nil {
		v.First = q.url()
	}
	if page.Prev != nil {
		v.Prev = q.url("before", page.Prev.String())
	}
	if page.Next != nil {
		v.Next = q.url("after", page.Next.String())
	}
	v.SortLinks = map[string]string{}
	for _, k := range replay.SortKeys {
		// A column's link sorts by it, newest or largest first; on the
		// column sorted by, it flips the direction.
		s := replay.Sort{Key: k}
		if q.sort.Key == k {
			s.Asc = !q.sort.Asc
		}
		sq := q
		sq.sort = s
		v.SortLinks[string(k)] = sq.url("sort", s.String())
	}
}

// filterForm is the failed page's filter form, filled with what was typed.
// A field with choices is a list of them (the projections the binary
// knows, the reasons failed rows have now), plus whatever was typed; the
// others are typed.
func filterForm(raw url.Values, choices map[string][]string) []field {
	choice := func(name string, values []string) []option {
		cur := raw.Get(name)
		values = slices.Clone(values)
		if cur != "" && !slices.Contains(values, cur) {
			values = append(values, cur)
		}
		slices.Sort(values)
		opts := []option{{Value: "", Label: "any", Selected: cur == ""}}
		for _, val := range values {
			opts = append(opts, option{Value: val, Label: val, Selected: val == cur})
		}
		return opts
	}
	placeholders := map[string]string{"since": "24h, 7d, 2025-06-01 or RFC3339", "until": "same forms as since",
		"scope_key": "e.g. library-3", "entity_type": "e.g. book", "text": "words in the last error", "reason": "e.g. mapping_error"}
	var fs []field
	for _, name := range filterFields {
		f := field{Name: name, Label: filterLabels[name], Value: raw.Get(name), Placeholder: placeholders[name]}
		if values, ok := choices[name]; ok {
			f.Options = choice(name, values)
		}
		fs = append(fs, f)
	}
	return fs
}

var sortLabels = map[replay.SortKey]string{replay.SortFailedAt: "failed at", replay.SortID: "id",
	replay.SortAttempts: "attempts", replay.SortReplays: "replays"}

func sortField(cur string) field {
	f := field{Name: "sort", Label: "sort by"}
	for _, k := range replay.SortKeys {
		for _, asc := range []bool{false, true} {
			s := replay.Sort{Key: k, Asc: asc}
			dir := ", newest first"
			if k != replay.SortFailedAt {
				dir = ", largest first"
			}
			if asc {
				dir = strings.NewReplacer("newest", "oldest", "largest", "smallest").Replace(dir)
			}
			f.Options = append(f.Options, option{Value: s.String(), Label: sortLabels[k] + dir,
				Selected: s.String() == cur || (cur == "" && s == replay.SortDefault)})
		}
	}
	return f
}

type eventView struct {
	Event  replay.EventDetail
	Audits []outbox.AuditEntry
	// CanAct offers replay and discard, CanRestore restore.
	CanAct, CanRestore bool
	// Masked says the payload is shown masked (MaskPaths), Unmasked that
	// this response shows it whole; CanUnmask offers the audited read.
	Masked, Unmasked, CanUnmask bool
	MaskPaths                   []string
}

func (v eventView) section() string {
	if v.Event.ArchivedAt.IsZero() {
		return "failed"
	}
	return "archived"
}

// pathID reads the {id} of the path: a positive number.
func pathID(r *http.Request, what string) (int64, error) {
	s := r.PathValue("id")
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, badf("%s id %q is not a positive number", what, s)
	}
	return id, nil
}

func (c *Console) event(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r, "event")
	if err != nil {
		c.refuse(w, r, http.StatusBadRequest, err.Error())
		return
	}
	if d, ok := c.readEvent(w, r, id); ok {
		c.eventPage(w, r, d, false)
	}
}

// readEvent reads event id, or answers why it cannot.
func (c *Console) readEvent(w http.ResponseWriter, r *http.Request, id int64) (replay.EventDetail, bool) {
	d, err := replay.Event(r.Context(), c.deps.Pool, id)
	switch {
	case errors.Is(err, replay.ErrNotFound) && viewAllowed(r) != nil:
		// Held to some scopes, a person learns no more of an id that is
		// not there than of one of another scope.
		c.deny(w, r, policy.View, fmt.Sprintf("view event %d", id), []int64{id})
		return d, false
	case errors.Is(err, replay.ErrNotFound):
		c.renderError(w, r, http.StatusNotFound, "message", "Not found", nil,
			"There is no event "+strconv.FormatInt(id, 10)+" in the outbox or the dead letter (done events are pruned after the retention).")
		return d, false
	case err != nil:
		c.fail(w, r, err)
		return d, false
	}
	if !c.mayView(w, r, id, d.Projection, d.ScopeKey) {
		return d, false
	}
	return d, true
}

// eventPage shows d, its payload masked unless unmasked (the audited read
// of unmasked).
func (c *Console) eventPage(w http.ResponseWriter, r *http.Request, d replay.EventDetail, unmasked bool) {
	audits, err := outbox.AuditLog(r.Context(), c.deps.Pool, outbox.AuditFilter{EventID: d.ID, Limit: 100, Allowed: viewAllowed(r)})
	if err != nil {
		c.fail(w, r, err)
		return
	}
	m := c.deps.Masks[d.Projection]
	masked := d.Mask(m, unmasked)
	g := grantsOf(r)
	v := eventView{Event: d, Audits: audits,
		CanRestore: g.Can(policy.Restore, d.Projection, d.ScopeKey) && !d.ArchivedAt.IsZero() && d.Status != outbox.StatusDiscarded,
		CanAct: (g.Can(policy.Replay, d.Projection, d.ScopeKey) || g.Can(policy.Discard, d.Projection, d.ScopeKey)) &&
			d.Status == outbox.StatusFailed && d.ArchivedAt.IsZero(),
		Masked: masked, Unmasked: unmasked && !m.Empty(), CanUnmask: masked && mayUnmask(r, d), MaskPaths: m.Paths()}
	c.render(w, r, http.StatusOK, "event", "Event "+strconv.FormatInt(d.ID, 10), v)
}

// auditActions are the actions an audit row may record.
var auditActions = []string{"replay", "discard", "archive", "restore", "pause", "resume", "unmask", "refused"}

var auditFields = []string{"action", "by", "text", "since", "until", "event", "before"}

type auditView struct {
	Fields  []field
	Entries []outbox.AuditEntry
	Older   string
	First   string
}

func (c *Console) audit(w http.ResponseWriter, r *http.Request) {
	raw := r.URL.Query()
	v := auditView{Fields: auditForm(raw)}
	f, err := parseAuditQuery(raw, time.Now())
	if err != nil {
		c.renderError(w, r, http.StatusBadRequest, "audit", "Audit log", v, err.Error())
		return
	}
	f.Allowed = viewAllowed(r)
	// One row past the page tells whether there are older ones.
	limit := f.Limit
	f.Limit++
	entries, err := outbox.AuditLog(r.Context(), c.deps.Pool, f)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	base := url.Values{}
	for _, k := range auditFields {
		if s := raw.Get(k); s != "" && k != "before" {
			base.Set(k, s)
		}
	}
	if len(entries) > limit {
		entries = entries[:limit]
		older := url.Values{}
		for k, s := range base {
			older[k] = s
		}
		older.Set("before", strconv.FormatInt(entries[len(entries)-1].ID, 10))
		v.Older = Prefix + "audit?" + older.Encode()
	}
	if f.Before != 0 {
		v.First = Prefix + "audit?" + base.Encode()
	}
	v.Entries = entries
	c.render(w, r, http.StatusOK, "audit", "Audit log", v)
}

func parseAuditQuery(raw url.Values, now time.Time) (outbox.AuditFilter, error) {
	f := outbox.AuditFilter{Limit: outbox.AuditLimitDefault}
	for k, vals := range raw {
		if !slices.Contains(auditFields, k) {
			return f, badf("unknown filter %q: the audit log filters by %s", k, strings.Join(auditFields[:6], ", "))
		}
		if len(vals) > 1 {
			return f, badf("the filter %s is given %d times; give it once", k, len(vals))
		}
	}
	f.Action, f.By, f.Text = raw.Get("action"), strings.TrimSpace(raw.Get("by")), strings.TrimSpace(raw.Get("text"))
	if f.Action != "" && !slices.Contains(auditActions, f.Action) {
		return f, badf("action %q is none of %s", f.Action, strings.Join(auditActions, ", "))
	}
	var err error
	if f.Since, f.Until, err = parseWindow(raw.Get("since"), raw.Get("until"), "", now); err != nil {
		return f, err
	}
	for _, n := range []struct {
		name string
		dst  *int64
	}{{"event", &f.EventID}, {"before", &f.Before}} {
		if s := strings.TrimSpace(raw.Get(n.name)); s != "" {
			id, err := strconv.ParseInt(s, 10, 64)
			if err != nil || id <= 0 {
				return f, badf("%s %q is not a positive number", n.name, s)
			}
			*n.dst = id
		}
	}
	return f, nil
}

func auditForm(raw url.Values) []field {
	action := field{Name: "action", Label: "action", Options: []option{{Value: "", Label: "any", Selected: raw.Get("action") == ""}}}
	for _, a := range auditActions {
		action.Options = append(action.Options, option{Value: a, Label: a, Selected: raw.Get("action") == a})
	}
	return []field{
		action,
		{Name: "by", Label: "by", Value: raw.Get("by"), Placeholder: "a user, or auto"},
		{Name: "text", Label: "why contains", Value: raw.Get("text")},
		{Name: "since", Label: "since", Value: raw.Get("since"), Placeholder: "24h, 7d, a date or RFC3339"},
		{Name: "until", Label: "until", Value: raw.Get("until")},
		{Name: "event", Label: "event id", Value: raw.Get("event")},
	}
}

type auditEntryView struct {
	Entry outbox.AuditEntry
	// Shown are the ids listed one by one, when few enough to link.
	Shown []int64
}

func (c *Console) auditEntry(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r, "audit")
	if err != nil {
		c.refuse(w, r, http.StatusBadRequest, err.Error())
		return
	}
	a, err := outbox.ReadAudit(r.Context(), c.deps.Pool, id)
	switch {
	case errors.Is(err, replay.ErrNotFound) && viewAllowed(r) != nil:
		c.deny(w, r, policy.View, fmt.Sprintf("view audit row %d", id), nil)
		return
	case errors.Is(err, replay.ErrNotFound):
		c.renderError(w, r, http.StatusNotFound, "message", "Not found", nil, "There is no audit row "+strconv.FormatInt(id, 10)+".")
		return
	case err != nil:
		c.fail(w, r, err)
		return
	}
	if !c.mayViewAudit(w, r, a) {
		return
	}
	v := auditEntryView{Entry: a}
	if len(a.IDs) <= 200 {
		v.Shown = a.IDs
	}
	c.render(w, r, http.StatusOK, "audit_entry", "Audit "+strconv.FormatInt(id, 10), v)
}

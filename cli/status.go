package cli

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/replica"
)

type statusCmd struct {
	dbFlags
	projectionsFlags
	MaxProcessingSeconds float64       `name:"max-processing-seconds" help:"A processing event older than this counts as stuck, even with a live lease." env:"OUTBOX_MAX_PROCESSING_SECONDS" default:"${max_processing}"`
	Retention            time.Duration `help:"The leader's retention of events: status counts the done rows older than one and a half times this (the rotation is late on them)." env:"OUTBOX_RETENTION" default:"${retention}"`
	Exact                bool          `help:"Count done events exactly; this reads the whole table. Without it the done count is an estimate."`
	JSON                 bool          `name:"json" help:"Print one JSON object."`
}

// statusJSON is the --json shape of status: durations in seconds, so any
// tool can read them.
type statusJSON struct {
	TakenAt                 time.Time             `json:"taken_at"`
	Counts                  map[string]int64      `json:"counts"`
	DoneExact               bool                  `json:"done_exact"`
	Lag                     int64                 `json:"lag"`
	OldestPendingAgeSeconds float64               `json:"oldest_pending_age_seconds"`
	RetentionSeconds        float64               `json:"retention_seconds"`
	DoneOverRetention       int64                 `json:"done_over_retention"`
	DoneOverRetentionCapped bool                  `json:"done_over_retention_capped"`
	OldestDoneAgeSeconds    float64               `json:"oldest_done_age_seconds"`
	InFlight                int64                 `json:"in_flight"`
	Stuck                   int64                 `json:"stuck"`
	MaxProcessingSeconds    float64               `json:"max_processing_seconds"`
	TopFailedReasons        []reasonCountJSON     `json:"top_failed_reasons"`
	Leader                  *leaderJSON           `json:"leader"`
	Projections             []projectionJSON      `json:"projections"`
	ProjectionsHashes       *projectionHashesJSON `json:"projections_hashes,omitempty"`
	Rebuilds                []rebuildJSON         `json:"rebuilds"`
	Horizon                 horizonJSON           `json:"horizon"`
	Vacuum                  []tableVacuumJSON     `json:"vacuum"`
}

// horizonJSON is who holds the database's vacuum horizon. AgeSeconds is
// null when Postgres shows this role no start for the holder; AgeBasis says
// where it came from ("postgres"), and AgeTransactions is always known.
type horizonJSON struct {
	Kind            string             `json:"kind"`
	Holder          *horizonHolderJSON `json:"holder"`
	AgeSeconds      *float64           `json:"age_seconds"`
	AgeBasis        string             `json:"age_basis,omitempty"`
	AgeTransactions int64              `json:"age_transactions"`
}

type horizonHolderJSON struct {
	Kind            string    `json:"kind"`
	Wlproj          bool      `json:"wlproj"`
	PID             int32     `json:"pid,omitempty"`
	ApplicationName string    `json:"application_name,omitempty"`
	State           string    `json:"state,omitempty"`
	Name            string    `json:"name,omitempty"`
	Xid             int64     `json:"xid"`
	Since           time.Time `json:"since,omitzero"`
}

// tableVacuumJSON is a table's dead and live rows and last autovacuum.
type tableVacuumJSON struct {
	Table          string    `json:"table"`
	DeadTuples     int64     `json:"dead_tuples"`
	LiveTuples     int64     `json:"live_tuples"`
	LastAutovacuum time.Time `json:"last_autovacuum,omitzero"`
}

// rebuildJSON is a rebuild whose two indexes the leader writes, and
// whether the current leader confirmed it does: a swap or rollback needs it.
type rebuildJSON struct {
	ID             int64     `json:"id"`
	Projection     string    `json:"projection"`
	State          string    `json:"state"`
	Target         string    `json:"target_index"`
	Old            string    `json:"old_index,omitempty"`
	Confirmed      bool      `json:"confirmed"`
	Problem        string    `json:"problem,omitempty"`
	ConfirmedEpoch int64     `json:"confirmed_epoch,omitempty"`
	ConfirmedBy    string    `json:"confirmed_by,omitempty"`
	SeenAt         time.Time `json:"seen_at,omitzero"`
	LeaderEpoch    int64     `json:"leader_epoch,omitempty"`
}

// projectionJSON is one projection's lag and pause state; the pause fields
// are those of its last pause or resume, empty if it never had one.
type projectionJSON struct {
	Projection              string    `json:"projection"`
	Paused                  bool      `json:"paused"`
	Pending                 int64     `json:"pending"`
	OldestPendingAgeSeconds float64   `json:"oldest_pending_age_seconds"`
	ChangedBy               string    `json:"changed_by,omitempty"`
	Why                     string    `json:"why,omitempty"`
	ChangedAt               time.Time `json:"changed_at,omitzero"`
}

type reasonCountJSON struct {
	Projection string `json:"projection"`
	Reason     string `json:"reason"`
	Count      int64  `json:"count"`
}

type leaderJSON struct {
	Name     string    `json:"name"`
	WorkerID string    `json:"worker_id"`
	Epoch    int64     `json:"epoch"`
	Since    time.Time `json:"since"`
	Active   bool      `json:"active"`
}

func (c *statusCmd) Run(g *globals) error {
	names, err := c.names()
	if err != nil {
		return usagef("%s", err)
	}
	return opsRun(g, c, func(ctx context.Context, conn *pgx.Conn) error {
		if c.MaxProcessingSeconds <= 0 {
			return usagef("--max-processing-seconds (OUTBOX_MAX_PROCESSING_SECONDS) must be positive, got %g", c.MaxProcessingSeconds)
		}
		maxProcessing := seconds(c.MaxProcessingSeconds)
		s, err := outbox.TakeSnapshotWith(ctx, conn, outbox.SnapshotOptions{
			MaxProcessing: maxProcessing, ExactDone: c.Exact, Retention: rotationLate(c.Retention), Projections: names,
			Rebuilds: true})
		if err != nil {
			return err
		}
		h, err := outbox.ReadHorizon(ctx, conn)
		if err != nil {
			return err
		}
		hashes := c.projectionHashes(ctx, conn, s.Leader)
		if c.JSON {
			out := statusJSON{
				TakenAt: s.TakenAt.UTC(), Counts: s.Counts, DoneExact: s.DoneExact, Lag: s.Lag,
				OldestPendingAgeSeconds: s.OldestPendingAge.Seconds(), InFlight: s.InFlight, Stuck: s.Stuck,
				RetentionSeconds: c.Retention.Seconds(), DoneOverRetention: s.DoneOverRetention,
				DoneOverRetentionCapped: s.DoneOverRetentionCapped,
				OldestDoneAgeSeconds:    s.OldestDoneAge.Seconds(),
				MaxProcessingSeconds:    c.MaxProcessingSeconds, TopFailedReasons: []reasonCountJSON{},
			}
			for _, r := range s.TopFailedReasons {
				out.TopFailedReasons = append(out.TopFailedReasons, reasonCountJSON(r))
			}
			if l := s.Leader; l != nil {
				out.Leader = &leaderJSON{Name: l.Name, WorkerID: l.Holder, Epoch: l.Epoch, Since: l.AcquiredAt.UTC(), Active: l.Active}
			}
			out.Projections, out.ProjectionsHashes = projectionsJSON(s.Projections), hashes
			out.Rebuilds = rebuildsJSON(s.Rebuilds)
			out.Horizon, out.Vacuum = horizonToJSON(h), vacuumJSON(h.Tables)
			return writeJSONLines(g.stdout, []statusJSON{out})
		}
		writeStatus(g.stdout, s, h, maxProcessing, c.Retention, databaseTarget(conn))
		writeProjectionHashes(g.stdout, hashes)
		return nil
	})
}

// projectionHashesJSON compares the projections the leader runs with this
// projections file's (replica.Specs.Hash).
type projectionHashesJSON struct {
	File   string `json:"file"`
	Hash   string `json:"hash"`
	Leader string `json:"leader"`
	Agree  bool   `json:"agree"`
}

// projectionHashes is nil without a projections file, or a leader's
// recorded hash (a binary or schema before 22 records none).
func (c *statusCmd) projectionHashes(ctx context.Context, conn *pgx.Conn, l *outbox.LeaderInfo) *projectionHashesJSON {
	if c.ProjectionsFile == "" || l == nil {
		return nil
	}
	specs, err := replica.LoadProjectionsUnresolved(c.ProjectionsFile)
	if err != nil {
		return nil // names() read it already; it cannot fail now but for a race with an edit
	}
	a, err := outbox.CompareProjections(ctx, conn, l.Name, specs.Hash())
	if err != nil || a.Leader == "" {
		return nil
	}
	return &projectionHashesJSON{File: c.ProjectionsFile, Hash: a.Hash, Leader: a.Leader, Agree: a.Agree()}
}

func writeProjectionHashes(w io.Writer, h *projectionHashesJSON) {
	if h == nil {
		return
	}
	verdict := "the same"
	if !h.Agree {
		verdict = "DIFFERENT: the replicas run different projections (runbook: Projections file)"
	}
	fmt.Fprintf(w, "projections  leader %s, %s %s: %s\n", h.Leader, h.File, h.Hash, verdict)
}

func writeStatus(w io.Writer, s outbox.Snapshot, h outbox.Horizon, maxProcessing, retention time.Duration, target string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "database\t%s\n", target)
	fmt.Fprintf(tw, "at\t%s\n", formatTime(s.TakenAt))
	for _, st := range []string{outbox.StatusPending, outbox.StatusProcessing, outbox.StatusDone, outbox.StatusFailed, outbox.StatusDiscarded} {
		note := ""
		if st == outbox.StatusDone && !s.DoneExact {
			note = " (estimate; --exact counts)"
		}
		fmt.Fprintf(tw, "%s\t%d%s\n", st, s.Counts[st], note)
	}
	oldest := "nothing pending"
	if s.Lag > 0 {
		oldest = "oldest " + formatAge(s.OldestPendingAge)
	}
	fmt.Fprintf(tw, "lag\t%d pending, %s\n", s.Lag, oldest)
	fmt.Fprintf(tw, "in flight\t%d\n", s.InFlight)
	fmt.Fprintf(tw, "stuck\t%d (lease expired or processing longer than %s)\n", s.Stuck, maxProcessing)
	late := "none older than that"
	if s.DoneOverRetention > 0 {
		atLeast := ""
		if s.DoneOverRetentionCapped {
			atLeast = " or more" // the count stops at outbox.RetentionCountCap of each kind
		}
		late = fmt.Sprintf("%d%s done older than that: the rotation is late, see its log", s.DoneOverRetention, atLeast)
	}
	fmt.Fprintf(tw, "retention\t%s: rows go with their partition within %s; %s; oldest done %s\n",
		durationText(retention), durationText(rotationLate(retention)), late, formatAge(s.OldestDoneAge))
	switch l := s.Leader; {
	case l == nil:
		fmt.Fprintf(tw, "leader\tnone has ever led\n")
	case l.Active:
		fmt.Fprintf(tw, "leader\t%s, epoch %d, since %s (%s ago)\n", l.Holder, l.Epoch, formatTime(l.AcquiredAt),
			formatAge(s.TakenAt.Sub(l.AcquiredAt)))
	default:
		fmt.Fprintf(tw, "leader\tnone active; last was %s, epoch %d, from %s\n", l.Holder, l.Epoch, formatTime(l.AcquiredAt))
	}
	writeHorizon(tw, h)
	tw.Flush()
	writeProjections(w, s.Projections)
	writeRebuilds(w, s.Rebuilds)
	if len(s.TopFailedReasons) == 0 {
		return
	}
	fmt.Fprintln(w, "top failed reasons:")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  PROJECTION\tREASON\tCOUNT")
	for _, r := range s.TopFailedReasons {
		fmt.Fprintf(tw, "  %s\t%s\t%d\n", r.Projection, dash(r.Reason), r.Count)
	}
	tw.Flush()
}

// writeProjections prints each projection's backlog and, for a paused one,
// who paused it, why and since when: its lag grows on purpose.
func writeProjections(w io.Writer, projections []outbox.ProjectionLag) {
	if len(projections) == 0 {
		return
	}
	fmt.Fprintln(w, "projections:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  PROJECTION\tSTATE\tPENDING\tOLDEST\tPAUSED_SINCE\tBY\tWHY")
	for _, p := range projections {
		oldest := "-"
		if p.Pending > 0 {
			oldest = formatAge(p.OldestPendingAge)
		}
		state, since, by, why := "running", "-", "-", "-"
		if p.State.Paused {
			state, since, by, why = "paused", formatTime(p.State.ChangedAt), p.State.ChangedBy, snippet(p.State.Why, lastErrorColumn)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\t%s\t%s\t%s\n", p.Projection, state, p.Pending, oldest, since, by, why)
	}
	tw.Flush()
}

// writeRebuilds prints each rebuild whose two indexes the leader writes,
// and whether the current leader confirmed it does.
func writeRebuilds(w io.Writer, rebuilds []outbox.RebuildWrite) {
	for _, r := range rebuilds {
		what := fmt.Sprintf("rebuild #%d of %s (%s): writing %s", r.ID, r.Projection, r.State, r.Target)
		if r.Old != "" {
			what += " and " + r.Old
		}
		if p := r.Problem(); p != "" {
			fmt.Fprintf(w, "%s: NOT CONFIRMED: %s\n", what, p)
			continue
		}
		fmt.Fprintf(w, "%s: confirmed by the leader (epoch %d, worker %s) %s ago\n", what, r.ConfirmedEpoch, r.ConfirmedBy,
			formatAge(r.Age))
	}
}

func rebuildsJSON(rebuilds []outbox.RebuildWrite) []rebuildJSON {
	out := make([]rebuildJSON, 0, len(rebuilds))
	for _, r := range rebuilds {
		j := rebuildJSON{ID: r.ID, Projection: r.Projection, State: r.State, Target: r.Target, Old: r.Old,
			Confirmed: r.Problem() == "", Problem: r.Problem(), ConfirmedEpoch: r.ConfirmedEpoch, ConfirmedBy: r.ConfirmedBy,
			LeaderEpoch: r.LeaderEpoch}
		if !r.SeenAt.IsZero() {
			j.SeenAt = r.SeenAt.UTC()
		}
		out = append(out, j)
	}
	return out
}

func projectionsJSON(projections []outbox.ProjectionLag) []projectionJSON {
	out := make([]projectionJSON, 0, len(projections))
	for _, p := range projections {
		j := projectionJSON{Projection: p.Projection, Paused: p.State.Paused, Pending: p.Pending,
			OldestPendingAgeSeconds: p.OldestPendingAge.Seconds(), ChangedBy: p.State.ChangedBy, Why: p.State.Why}
		if !p.State.ChangedAt.IsZero() {
			j.ChangedAt = p.State.ChangedAt.UTC()
		}
		out = append(out, j)
	}
	return out
}

// writeHorizon says who holds the database's vacuum horizon and what the
// outbox and the ledger have not been able to vacuum, as rows of status's
// table.
func writeHorizon(tw io.Writer, h outbox.Horizon) {
	fmt.Fprintf(tw, "horizon\t%s\n", horizonText(h))
	for _, t := range h.Tables {
		last := "never"
		if !t.LastAutovacuum.IsZero() {
			last = formatTime(t.LastAutovacuum) + " (" + formatAge(h.TakenAt.Sub(t.LastAutovacuum)) + " ago)"
		}
		fmt.Fprintf(tw, "vacuum\t%s: %d dead, %d live, last autovacuum %s\n", t.Table, t.Dead, t.Live, last)
	}
}

// horizonText names the oldest holder of the horizon, for how long and how
// many transactions ago it took its snapshot.
func horizonText(h outbox.Horizon) string {
	if h.Holder == nil {
		return "nothing holds a snapshot: vacuum can remove every dead row"
	}
	age := "held for a time Postgres shows only to its own role and pg_read_all_stats"
	switch h.AgeBasis {
	case outbox.AgeFromPostgres:
		age = "held " + formatAge(h.Age)
	case outbox.AgeObserved:
		age = "seen for " + formatAge(h.Age)
	}
	return fmt.Sprintf("%s, %s, %d transactions ago", h.Holder, age, h.Holder.XidAge)
}

func horizonToJSON(h outbox.Horizon) horizonJSON {
	j := horizonJSON{Kind: h.Kind(), AgeBasis: h.AgeBasis}
	if h.AgeBasis != outbox.AgeUnknown || h.Holder == nil {
		age := h.Age.Seconds()
		j.AgeSeconds = &age
	}
	if hd := h.Holder; hd != nil {
		j.AgeTransactions = hd.XidAge
		j.Holder = &horizonHolderJSON{Kind: hd.Kind, Wlproj: hd.Wlproj(), PID: hd.PID, ApplicationName: hd.Application,
			State: hd.State, Name: hd.Name, Xid: hd.Xid}
		if !hd.Since.IsZero() {
			j.Holder.Since = hd.Since.UTC()
		}
	}
	return j
}

func vacuumJSON(tables []outbox.TableVacuum) []tableVacuumJSON {
	out := make([]tableVacuumJSON, 0, len(tables))
	for _, t := range tables {
		j := tableVacuumJSON{Table: t.Table, DeadTuples: t.Dead, LiveTuples: t.Live}
		if !t.LastAutovacuum.IsZero() {
			j.LastAutovacuum = t.LastAutovacuum.UTC()
		}
		out = append(out, j)
	}
	return out
}

// rotationLate is the age past which a done row shows the outbox's
// rotation is late: a partition goes once its rows are older than the
// retention, and the partitions rotate every half of it, so a row lives
// up to one and a half retentions.
func rotationLate(retention time.Duration) time.Duration {
	return retention * 3 / 2
}

package main

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// Report is tools/drill/report.json.
type Report struct {
	OK bool `json:"ok"`
	harness.RunReport
	Settings Settings `json:"settings"`

	Scenarios []*Scenario `json:"scenarios"`

	Events    Events `json:"events"`
	Entities  int    `json:"entities"`
	Regressed int    `json:"documents_regressed"`
	// Missing and Resurrected are the other two ways a document can be wrong:
	// absent though its newest event is an upsert, present though it is a delete.
	Missing     int `json:"documents_missing"`
	Resurrected int `json:"documents_resurrected"`
	// LedgerMismatch documents have a ledger entry other than their newest
	// done event's version and op, or none.
	LedgerMismatch int      `json:"documents_ledger_mismatch"`
	BadSamples     []string `json:"bad_documents_sample,omitempty"`

	// ReplayedRows are the events returned from failed to pending by a
	// replay (replay_count > 0).
	ReplayedRows int64 `json:"replayed_rows"`
	// SupersededByLedger are events acked without being sent because the
	// ledger held their version or a newer one: outbox_superseded_total
	// {cause="ledger"} scraped like FencedAcks, so a lower bound.
	SupersededByLedger int64 `json:"superseded_by_ledger"`

	// DuplicateSends counts events claimed again after a claim whose outcome
	// was never recorded; see the package doc.
	DuplicateSends int64 `json:"duplicate_sends"`
	// ResentAtLeast are acks beyond one per done event: the replicas'
	// outbox_processed_total{projection="search"}, scraped like FencedAcks
	// and summed, less the done events. A new leader sends again the queued
	// rows read after the last saved position (about a second's worth), of
	// which the outbox keeps no trace. A lower bound: a killed process's
	// acks after its last scrape are not counted.
	ResentAtLeast int64 `json:"resent_at_least"`
	// FencedAcks are acks the fencing guard refused: outbox_fenced_acks_total
	// scraped from each replica while it lived, its highest value per process.
	FencedAcks int64 `json:"fenced_acks"`
	// Rotations are the rotations of the outbox's partitions and of the
	// ledger's during the run.
	Rotations Rotations `json:"rotations"`
	// PermissionErrors counts replica log lines with "permission denied":
	// the runtime role must have every privilege the daemon uses.
	PermissionErrors int `json:"permission_errors"`

	Roles   Roles  `json:"roles"`
	LogsDir string `json:"logs_dir,omitempty"`
}

// Settings are the sizes the drill ran with.
type Settings struct {
	Rate            int     `json:"rate_per_second"`
	Entities        int     `json:"entities"`
	Kills           int     `json:"kills"`
	Replays         int     `json:"replay_books_per_story"`
	OutageSeconds   float64 `json:"outage_seconds"`
	SoakSeconds     float64 `json:"soak_seconds"`
	SoakRate        int     `json:"soak_rate_per_second"`
	PGRestart       bool    `json:"pg_restart"`
	PGFailover      bool    `json:"pg_failover"`
	MaxAttempts     int     `json:"max_attempts"`
	KeepaliveWindow float64 `json:"keepalive_window_seconds"`
	// RetentionSeconds and TombstoneRetentionSeconds are the replicas'
	// OUTBOX_RETENTION and OUTBOX_LEDGER_TOMBSTONE_RETENTION.
	RetentionSeconds          float64 `json:"retention_seconds"`
	TombstoneRetentionSeconds float64 `json:"tombstone_retention_seconds"`
	MinRotations              int     `json:"min_rotations"`
}

// Rotations are how often each table rotated: the replicas' counters
// (outbox_events_rotations_total, outbox_ledger_rotations_total, scraped
// like FencedAcks and summed, so a lower bound) and the partitions the
// rotation archive saw emptied (harness.InstallRotationArchive), with the
// rows it kept for the verdict.
type Rotations struct {
	Events  int64               `json:"events"`
	Ledger  int64               `json:"ledger"`
	Archive harness.Truncations `json:"archived"`
}

// check says which table rotated fewer than min times, by the replicas'
// counters.
func (r Rotations) check(minimum int) []string {
	var short []string
	for table, n := range map[string]int64{"outbox_events": r.Events, "outbox_ledger": r.Ledger} {
		if n < int64(minimum) {
			short = append(short, fmt.Sprintf("%s rotated %d times, fewer than %d: lengthen the run or shorten -retention", table, n, minimum))
		}
	}
	slices.Sort(short)
	return short
}

// Events are the outbox totals after the drain.
type Events struct {
	// Produced are the rows found in the outbox.
	Produced            int64 `json:"produced"`
	Done                int64 `json:"done"`
	Failed              int64 `json:"failed"`
	FailedWithoutReason int64 `json:"failed_without_reason"`
	Discarded           int64 `json:"discarded"`
	// Lost are the events written (ProducerCommitted + DrillWritten) that
	// are not done, failed or discarded: still pending or processing, or
	// gone from the outbox (Vanished), as a faulty prune or archive would
	// leave them.
	Lost     int64 `json:"lost"`
	Vanished int64 `json:"rows_vanished"`
	// Unaccounted are rows in the outbox beyond those written: an insert
	// that failed on the client after Postgres committed it, during a
	// restart, is one; with no failed insert, a bug.
	Unaccounted int64 `json:"rows_unaccounted"`
	// ProducerCommitted and ProducerErrors are the producer's own view:
	// inserts that failed while Postgres restarted wrote nothing.
	ProducerCommitted int64 `json:"producer_committed"`
	ProducerErrors    int64 `json:"producer_failed_inserts"`
	// DrillWritten are the rows the drill wrote itself: the replay
	// scenario's seed.
	DrillWritten int64 `json:"drill_written"`
	// Late are the versions handed to the producer after the next version
	// of their book (a failed insert loses some); Unversioned are the events
	// committed without an event_version, part of ProducerCommitted. The
	// replay scenario's rows are in DrillWritten, not here.
	Late        int64 `json:"late_versions"`
	Unversioned int64 `json:"unversioned"`
}

// settle is the outbox totals of v judged against written, the rows the
// producers committed and the drill wrote: a written row that is gone from
// the outbox is lost, whatever the outbox's own counts say.
func settle(v harness.Verdict, written int64) Events {
	e := Events{Produced: v.Events, Done: v.Done, Failed: v.Failed, FailedWithoutReason: v.FailedWithoutReason,
		Discarded: v.Discarded}
	e.Vanished = max(0, written-v.Events)
	e.Unaccounted = max(0, v.Events-written)
	e.Lost = v.Lost + e.Vanished
	return e
}

// Roles are the roles roles.sql created for the run.
type Roles struct {
	Owner   string `json:"owner"`
	Runtime string `json:"runtime"`
}

// Scenario is one timed step of the drill.
type Scenario struct {
	Name            string  `json:"name"`
	OK              bool    `json:"ok"`
	Error           string  `json:"error,omitempty"`
	DurationSeconds float64 `json:"duration_seconds"`
	// Database is the database during the scenario, sampled every half
	// second: what held the vacuum horizon, wlproj's oldest snapshot, dead
	// rows, lock waits, the backlog.
	Database *harness.HealthSummary `json:"database,omitempty"`
	// Soak is the soak scenario's figures.
	Soak *SoakResult `json:"soak,omitempty"`
	// Takeover is fault → the first event the new leader applied, per
	// repetition (harness.WaitFirstAck: the ledger's applied_at of its
	// first ack of a queued row, or a claimed row's processed_at).
	Takeover *harness.Stats `json:"takeover_seconds,omitempty"`

	// engine-down
	BacklogBefore   *int64   `json:"backlog_before,omitempty"`
	BacklogPeak     *int64   `json:"backlog_peak,omitempty"`
	CatchUpSeconds  *float64 `json:"catch_up_seconds,omitempty"`
	FirstAckSeconds *float64 `json:"first_ack_after_engine_back_seconds,omitempty"`
	MaxAttempts     *int64   `json:"max_attempts_seen,omitempty"`
	// postgres-restart
	PGDownSeconds *float64 `json:"pg_restart_seconds,omitempty"`
	// postgres-failover: kill -9 of the primary → the standby promoted
	// (pg_ctl promote returned), and → the first event applied on it.
	PromotedSeconds      *float64 `json:"promoted_seconds,omitempty"`
	FirstAckOnNewPrimary *float64 `json:"first_ack_on_new_primary_seconds,omitempty"`
	// network-cut
	StopWritingSeconds *float64 `json:"cut_leader_stopped_writing_seconds,omitempty"`
	// rolling-sigterm
	ExitCodes []int `json:"exit_codes,omitempty"`
	// replay-after-delete: the rows replayed, of which behind the ledger
	// (a delete or a newer upsert of their book was applied since they
	// failed), and whether a canary proved the engine had forgotten its
	// deletes' versions first.
	Replayed            *int  `json:"replayed,omitempty"`
	ReplayedBehind      *int  `json:"replayed_behind_ledger,omitempty"`
	EngineForgotDeletes *bool `json:"engine_forgot_deletes,omitempty"`
	// deposed-leader-late-write: the bytes the killed leader's path to the
	// engine held, what became of them once the engine had forgotten the
	// delete ("dropped": its connection ended with an RST; "delivered"), and
	// whether the book came back.
	HeldBytes   *int64 `json:"held_bytes,omitempty"`
	HeldOutcome string `json:"held_bytes_outcome,omitempty"`
	Resurrected *bool  `json:"resurrected,omitempty"`
	// engine-node-loss
	NodeLoss *NodeLoss `json:"engine_node_loss,omitempty"`

	Leaders   []string `json:"leaders,omitempty"` // who led after each fault
	takeovers []float64
}

func ptr[T any](v T) *T { return &v }

// summary prints what an operator reads first; the JSON has the rest.
func (r *Report) summary(w io.Writer, path string) {
	verdict := "PASS"
	if !r.OK {
		verdict = "FAIL"
	}
	fmt.Fprintf(w, "\nwlproj drill: %s in %s (postgres %s, %s)\n", verdict,
		(time.Duration(r.DurationSeconds) * time.Second).String(), r.Versions.Postgres, r.Versions.Engine)
	fmt.Fprintf(w, "%-26s %-4s %-36s %s\n", "scenario", "ok", "takeover ms p50/p99/max (to 1st applied)", "notes")
	for _, s := range r.Scenarios {
		ok := "yes"
		if !s.OK {
			ok = "NO"
		}
		take := "-"
		if s.Takeover != nil {
			take = fmt.Sprintf("%.0f / %.0f / %.0f (n=%d)", s.Takeover.Median*1000, s.Takeover.P99*1000, s.Takeover.Max*1000, len(s.Takeover.Samples))
		}
		fmt.Fprintf(w, "%-26s %-4s %-36s %s\n", s.Name, ok, take, s.notes())
	}
	e := r.Events
	fmt.Fprintf(w, "events: written %d, in the outbox %d, done %d, failed %d, discarded %d, lost %d (gone from the outbox %d)\n",
		e.ProducerCommitted+e.DrillWritten, e.Produced, e.Done, e.Failed, e.Discarded, e.Lost, e.Vanished)
	fmt.Fprintf(w, "out of order: %d versions written late, %d events without a version\n", e.Late, e.Unversioned)
	fmt.Fprintf(w, "documents: %d books, regressed %d (missing %d, resurrected %d); ledger mismatches %d\n",
		r.Entities, r.Regressed, r.Missing, r.Resurrected, r.LedgerMismatch)
	fmt.Fprintf(w, "replayed rows: %d; events the ledger dropped unsent: %d\n", r.ReplayedRows, r.SupersededByLedger)
	fmt.Fprintf(w, "duplicate sends: %d (events re-claimed after an unrecorded claim: at most sent twice)\n", r.DuplicateSends)
	fmt.Fprintf(w, "acks beyond one per event: at least %d (queued rows sent again from a saved position)\n", r.ResentAtLeast)
	fmt.Fprintf(w, "acks refused by fencing: %d\n", r.FencedAcks)
	a := r.Rotations.Archive
	fmt.Fprintf(w, "rotations at a retention of %.0f s: outbox %d, ledger %d; archived %d and %d partitions emptied, %d events and %d ledger entries (copy at most %.3f s)\n",
		r.Settings.RetentionSeconds, r.Rotations.Events, r.Rotations.Ledger, a.Events, a.Ledger, a.EventRows, a.LedgerRows, a.CopyMaxSeconds)
	fmt.Fprintf(w, "replicas ran as %s (no permission errors: %t)\n", r.Roles.Runtime, r.PermissionErrors == 0)
	for _, p := range r.Problems {
		fmt.Fprintf(w, "PROBLEM: %s\n", p)
	}
	if r.LogsDir != "" {
		fmt.Fprintf(w, "replica logs kept in %s\n", r.LogsDir)
	}
	fmt.Fprintf(w, "report: %s\n", path)
}

func (s *Scenario) notes() string {
	var n []string
	if s.BacklogPeak != nil {
		n = append(n, fmt.Sprintf("backlog %d → peak %d", deref(s.BacklogBefore), *s.BacklogPeak))
	}
	if s.FirstAckSeconds != nil {
		n = append(n, fmt.Sprintf("first ack %.2f s after the engine was back", *s.FirstAckSeconds))
	}
	if s.CatchUpSeconds != nil {
		n = append(n, fmt.Sprintf("caught up in %.1f s", *s.CatchUpSeconds))
	}
	if s.MaxAttempts != nil {
		n = append(n, fmt.Sprintf("max attempts %d", *s.MaxAttempts))
	}
	if s.PGDownSeconds != nil {
		n = append(n, fmt.Sprintf("pg_ctl restart took %.1f s", *s.PGDownSeconds))
	}
	if s.PromotedSeconds != nil {
		n = append(n, fmt.Sprintf("standby promoted %.2f s after the kill", *s.PromotedSeconds))
	}
	if s.FirstAckOnNewPrimary != nil {
		n = append(n, fmt.Sprintf("first ack on the new primary %.2f s after the kill", *s.FirstAckOnNewPrimary))
	}
	if s.StopWritingSeconds != nil {
		n = append(n, fmt.Sprintf("cut leader stopped writing after %.2f s", *s.StopWritingSeconds))
	}
	if s.ExitCodes != nil {
		n = append(n, fmt.Sprintf("exit codes %v", s.ExitCodes))
	}
	if s.Replayed != nil {
		n = append(n, fmt.Sprintf("replayed %d rows, %d behind the ledger", *s.Replayed, deref(s.ReplayedBehind)))
	}
	if s.EngineForgotDeletes != nil {
		n = append(n, fmt.Sprintf("engine forgot the deletes: %t", *s.EngineForgotDeletes))
	}
	if s.HeldBytes != nil {
		n = append(n, fmt.Sprintf("held %d bytes, %s", *s.HeldBytes, cmp.Or(s.HeldOutcome, "never released")))
	}
	if s.Resurrected != nil {
		n = append(n, fmt.Sprintf("resurrected: %t", *s.Resurrected))
	}
	if s.NodeLoss != nil {
		n = append(n, s.NodeLoss.notes())
	}
	if s.Soak != nil {
		n = append(n, s.Soak.notes())
	}
	if h := s.Database; h != nil {
		n = append(n, fmt.Sprintf("oldest wlproj snapshot %.1f s", h.OursSeconds))
	}
	if s.Error != "" {
		n = append(n, "error: "+s.Error)
	}
	return strings.Join(n, "; ")
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

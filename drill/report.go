package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/wlproj/wlproj/internal/rig"
)

// Report is drill/report.json.
type Report struct {
	OK              bool      `json:"ok"`
	Problems        []string  `json:"problems,omitempty"`
	StartedAt       time.Time `json:"started_at"`
	DurationSeconds float64   `json:"duration_seconds"`
	Settings        Settings  `json:"settings"`
	Versions        Versions  `json:"versions"`

	Scenarios []*Scenario `json:"scenarios"`

	Events    Events `json:"events"`
	Entities  int    `json:"entities"`
	Regressed int    `json:"documents_regressed"`
	// Missing and Resurrected are the other two ways a document can be wrong:
	// absent though its newest event is an upsert, present though it is a delete.
	Missing     int      `json:"documents_missing"`
	Resurrected int      `json:"documents_resurrected"`
	BadSamples  []string `json:"bad_documents_sample,omitempty"`

	// DuplicateSends counts events claimed again after a claim whose outcome
	// was never recorded; see the package doc.
	DuplicateSends int64      `json:"duplicate_sends"`
	FencedAcks     FencedAcks `json:"fenced_acks"`
	// PermissionErrors counts replica log lines with "permission denied":
	// the runtime role must have every privilege the daemon uses.
	PermissionErrors int `json:"permission_errors"`

	Roles    Roles  `json:"roles"`
	Database string `json:"database"`
	Index    string `json:"index"`
	LogsDir  string `json:"logs_dir,omitempty"`
}

// Settings are the sizes the drill ran with.
type Settings struct {
	Rate            int     `json:"rate_per_second"`
	Entities        int     `json:"entities"`
	Kills           int     `json:"kills"`
	OutageSeconds   float64 `json:"outage_seconds"`
	PGRestart       bool    `json:"pg_restart"`
	MaxAttempts     int     `json:"max_attempts"`
	KeepaliveWindow float64 `json:"keepalive_window_seconds"`
}

// Versions of the servers the drill ran against.
type Versions struct {
	Postgres      string `json:"postgres"`
	Elasticsearch string `json:"elasticsearch"`
}

// Events are the outbox totals after the drain.
type Events struct {
	Produced            int64 `json:"produced"`
	Done                int64 `json:"done"`
	Failed              int64 `json:"failed"`
	FailedWithoutReason int64 `json:"failed_without_reason"`
	Lost                int64 `json:"lost"`
	// ProducerInserts and ProducerErrors are the producer's own view:
	// inserts that failed while Postgres restarted wrote nothing.
	ProducerCommitted int64 `json:"producer_committed"`
	ProducerErrors    int64 `json:"producer_failed_inserts"`
}

// FencedAcks are acks the fencing guard refused, counted two ways.
type FencedAcks struct {
	Metrics int64 `json:"metrics"`
	Logs    int64 `json:"logs"`
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
	// Takeover is fault → first ack by the new leader, per repetition.
	Takeover *rig.Stats `json:"takeover_seconds,omitempty"`

	// engine-down
	BacklogBefore   *int64   `json:"backlog_before,omitempty"`
	BacklogPeak     *int64   `json:"backlog_peak,omitempty"`
	CatchUpSeconds  *float64 `json:"catch_up_seconds,omitempty"`
	FirstAckSeconds *float64 `json:"first_ack_after_engine_back_seconds,omitempty"`
	MaxAttempts     *int64   `json:"max_attempts_seen,omitempty"`
	// postgres-restart
	PGDownSeconds *float64 `json:"pg_restart_seconds,omitempty"`
	// network-cut
	StopWritingSeconds *float64 `json:"cut_leader_stopped_writing_seconds,omitempty"`
	// rolling-sigterm
	ExitCodes []int `json:"exit_codes,omitempty"`

	Leaders   []string `json:"leaders,omitempty"` // who led after each fault
	takeovers []float64
}

func ptr[T any](v T) *T { return &v }

func (r *Report) write(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// summary prints what an operator reads first; the JSON has the rest.
func (r *Report) summary(w io.Writer, path string) {
	verdict := "PASS"
	if !r.OK {
		verdict = "FAIL"
	}
	fmt.Fprintf(w, "\nwlproj drill: %s in %s (postgres %s, elasticsearch %s)\n", verdict,
		(time.Duration(r.DurationSeconds) * time.Second).String(), r.Versions.Postgres, r.Versions.Elasticsearch)
	fmt.Fprintf(w, "%-18s %-4s %-28s %s\n", "scenario", "ok", "takeover s min/median/max", "notes")
	for _, s := range r.Scenarios {
		ok := "yes"
		if !s.OK {
			ok = "NO"
		}
		take := "-"
		if s.Takeover != nil {
			take = fmt.Sprintf("%.2f / %.2f / %.2f (n=%d)", s.Takeover.Min, s.Takeover.Median, s.Takeover.Max, len(s.Takeover.Samples))
		}
		fmt.Fprintf(w, "%-18s %-4s %-28s %s\n", s.Name, ok, take, s.notes())
	}
	e := r.Events
	fmt.Fprintf(w, "events: produced %d, done %d, failed %d, lost %d\n", e.Produced, e.Done, e.Failed, e.Lost)
	fmt.Fprintf(w, "documents: %d books, regressed %d (missing %d, resurrected %d)\n", r.Entities, r.Regressed, r.Missing, r.Resurrected)
	fmt.Fprintf(w, "duplicate sends: %d (events re-claimed after an unrecorded claim: at most sent twice)\n", r.DuplicateSends)
	fmt.Fprintf(w, "acks refused by fencing: %d by the metrics, %d by the logs\n", r.FencedAcks.Metrics, r.FencedAcks.Logs)
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
	if s.StopWritingSeconds != nil {
		n = append(n, fmt.Sprintf("cut leader stopped writing after %.2f s", *s.StopWritingSeconds))
	}
	if s.ExitCodes != nil {
		n = append(n, fmt.Sprintf("exit codes %v", s.ExitCodes))
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

package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/leader"
)

// The database's health during each step under load, sampled by the
// harness (harness.WatchHealth) and reported beside the step's figures: a
// throughput or a latency measured while something held the vacuum
// horizon, or while wlproj waited for locks, is not the figure of a
// healthy database.

const (
	// wlprojSnapshotGoal is the oldest snapshot a wlproj session may hold:
	// a standby waits in one-second statements, and the leader's claims
	// and acks are short ones; "a few seconds" leaves room for a busy
	// machine.
	wlprojSnapshotGoal = 5 * time.Second
	// healthEvery is the pause between two samples: a standby's wait
	// slice is a second, so an older snapshot shows in several samples.
	healthEvery = time.Second
	// healthEverySmoke samples the smoke run's steps of a few seconds.
	healthEverySmoke = 200 * time.Millisecond
	// The tables that churn with every event: the outbox (an insert, a
	// claim and an ack each) and the ledger (an update per document).
	outboxTable = "outbox_events"
	ledgerTable = "outbox_ledger"
)

// StepHealth is the database during one step.
type StepHealth struct {
	Step string `json:"step"`
	harness.HealthSummary
}

func (b *bench) healthConfig() harness.HealthConfig {
	every := healthEvery
	if b.cfg.Smoke {
		every = healthEverySmoke
	}
	return harness.HealthConfig{Prefix: "wlproj", Election: leader.LockSessionName(""),
		Tables: []string{outboxTable, ledgerTable}, Backlog: true, Every: every}
}

// healthApplication names the sampler's sessions, so that the database
// CPU a step reports per event leaves the observer out: counting a
// 200,000-row backlog every second cost up to 83 ms a sample, 4% to 10%
// of a drain's database CPU, charged to wlproj.
const healthApplication = "bench-health"

// watchHealth starts sampling the database if s runs wlproj under load,
// on a connection of its own (healthApplication).
func (b *bench) watchHealth(ctx context.Context, s step) error {
	if !s.load {
		return nil
	}
	cfg, err := pgxpool.ParseConfig(b.s.DB.URL)
	if err != nil {
		return err
	}
	cfg.MaxConns = 1
	cfg.ConnConfig.RuntimeParams["application_name"] = healthApplication
	if b.healthPool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return fmt.Errorf("the health sampler's connection: %w", err)
	}
	b.health = harness.WatchHealth(b.healthPool, b.healthConfig())
	return nil
}

// recordHealth stops the step's sampling and reports its summary.
func (b *bench) recordHealth(s step) {
	if b.health == nil {
		return
	}
	h := harness.Summarize(b.health.Stop())
	b.health = nil
	b.healthPool.Close()
	b.rep.DatabaseHealth = append(b.rep.DatabaseHealth, StepHealth{Step: s.flag, HealthSummary: h})
	b.say("%s: database: oldest snapshot %.1fs (%d transactions, %s); oldest of wlproj %.1fs; outbox dead max %d, ledger dead max %d; %d of %d samples with a lock wait, %d with a standby waiting",
		s.flag, h.OldestSeconds, h.OldestXIDAge, h.OldestHolder, h.OursSeconds, h.Tables[outboxTable].DeadMax,
		h.Tables[ledgerTable].DeadMax, h.LockWaitSamples, h.Samples, h.StandbySamples)
}

func healthTargets(r *Report, add addTarget) {
	for _, h := range r.DatabaseHealth {
		add(h.Step+": oldest wlproj snapshot", fmt.Sprintf("<= %g", wlprojSnapshotGoal.Seconds()), h.OursSeconds, "s",
			h.OursSeconds <= wlprojSnapshotGoal.Seconds())
	}
}

// healthTable prints each step's database health as a table of its own.
func (r *Report) healthTable(w io.Writer) {
	if len(r.DatabaseHealth) == 0 {
		return
	}
	fmt.Fprintln(w, "\ndatabase during each step (sampled every second; dead: max / last, autovacuums in brackets)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "step\toldest snapshot\tits holder\toldest wlproj snapshot\toutbox dead\tledger dead\tlock waits\tstandby waiting")
	for _, h := range r.DatabaseHealth {
		fmt.Fprintf(tw, "%s\t%.1fs, %d xids\t%s\t%.1fs\t%s\t%s\t%d of %d\t%d of %d\n", h.Step, h.OldestSeconds, h.OldestXIDAge,
			clip(h.OldestHolder, 48), h.OursSeconds, deadCell(h.Tables[outboxTable]), deadCell(h.Tables[ledgerTable]),
			h.LockWaitSamples, h.Samples, h.StandbySamples, h.Samples)
	}
	tw.Flush()
}

func deadCell(t harness.TableSummary) string {
	return fmt.Sprintf("%d / %d (%d)", t.DeadMax, t.DeadLast, t.Autovacuums)
}

// clip shortens s to n runes for a table cell.
func clip(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return strings.TrimSpace(s)
}

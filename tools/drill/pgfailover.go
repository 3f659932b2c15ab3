package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// pgFailover kills the primary's postmaster with SIGKILL under load,
// promotes the standby, and waits for the replicas to find it through
// DATABASE_URL's second host (target_session_attrs=read-write) and elect a
// leader there. The stack commits synchronously to the standby, so nothing
// the producer saw committed may be missing afterwards: finish checks.
func (d *drill) pgFailover(ctx context.Context, sc *Scenario) error {
	_, epoch, t0, err := d.settled(ctx)
	if err != nil {
		return err
	}
	pid, err := postmasterPID(d.cfg.PG.Data)
	if err != nil {
		return err
	}
	d.say("postgres-failover: kill -9 of the primary's postmaster (pid %d), then pg_ctl promote of the standby", pid)
	// From here on the old primary must never come back as a second
	// read-write host, whatever happens to this scenario.
	d.failedOver = true
	killed := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill -9 %d: %w", pid, err)
	}
	if out, err := d.cfg.PG.ctlData(d.cfg.PG.StandbyData, "promote", "-w", "-t", "60"); err != nil {
		return fmt.Errorf("pg_ctl promote: %w: %s", err, bytes.TrimSpace(out))
	}
	sc.PromotedSeconds = ptr(harness.Round3(time.Since(killed).Seconds()))
	// The drill's own pool follows DATABASE_URL too; the first query on a
	// read-write host is on the promoted standby.
	var promoted time.Time
	if err := d.poll(ctx, "the promoted standby to accept writes", func(ctx context.Context) (bool, error) {
		var inRecovery bool
		err := d.s.DB.Pool.QueryRow(ctx, `SELECT pg_is_in_recovery(), now()`).Scan(&inRecovery, &promoted)
		return err == nil && !inRecovery, err
	}); err != nil {
		return err
	}
	// Acks after the promotion are on the new primary; t0, the kill, is by
	// the old one's clock, the same host's.
	h, err := d.takeover(ctx, sc, epoch, t0, promoted)
	if err != nil {
		return err
	}
	sc.FirstAckOnNewPrimary = ptr(h.secs)
	d.say("postgres-failover: standby promoted %.2f s after the kill; %s led at epoch %d and acked on it %.3f s after the kill",
		*sc.PromotedSeconds, h.next.name, h.epoch, h.secs)
	return d.waitStandby(ctx, d.other(h.next))
}

// postmasterPID reads the postmaster's pid, postmaster.pid's first line.
func postmasterPID(dataDir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("the primary's postmaster: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 1 {
		return 0, fmt.Errorf("the primary's postmaster.pid starts with %q, not a pid", line)
	}
	return pid, nil
}

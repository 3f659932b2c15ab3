package consume

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
)

// The model's move: the database is copied into another cluster, as an
// operator moves it to another server or provider, and the history goes
// on there. A fresh initdb costs seconds, so a history moves at most once,
// and only in some seeds: modelMoveSeeds of the default run, and one in
// modelMoveOdds of the others (every one with WLPROJ_MODEL_MOVE=1).

// modelMoveSeeds are the seeds of modelFastSeeds that move; the other fast
// seeds never do, so `make test` pays for one new cluster.
var modelMoveSeeds = []uint64{3}

const modelMoveOdds = 3

// modelMoveAt is how many events are still to be written when the
// database moves, -1 if it does not. It is drawn from a generator of its
// own, so a seed that does not move keeps the history it always had, and
// a moving seed's history is its old one up to the move. At least 40
// events are written before (the old cluster has done, failed and queued
// rows to carry, and its counter is ahead of a fresh one's), and at least
// 40 are left, more than any one step writes, so the producers always go
// on writing in the new cluster.
func modelMoveAt(seed uint64, total int) int {
	r := rand.New(rand.NewPCG(seed, 0x6d6f7665))
	moves := r.IntN(modelMoveOdds) == 0 && !slices.Contains(modelFastSeeds, seed)
	if slices.Contains(modelMoveSeeds, seed) || os.Getenv("WLPROJ_MODEL_MOVE") == "1" {
		moves = true
	}
	switch {
	case !moves:
		return -1
	case total < 80: // WLPROJ_MODEL_DOCS of a few
		return total / 2
	}
	return 40 + r.IntN(total-79)
}

// modelStops are the ways the operator stops the old cluster's leader
// before the move: a SIGTERM (the loop saves what it confirmed), a kill
// (positions saved up to a second back), or a SIGTERM only after the dump
// was taken, so what the old leader sent and confirmed meanwhile is in the
// engine but not in the dump, which the rebase sends again.
var modelStops = []string{"stopped", "killed", "stopped after the dump"}

// move copies the database into a fresh cluster with pg_dump, runs
// roles.sql there, and goes on: producers write into the new cluster at
// once; a replica refuses to lead there until the operator's rebase; the
// rebase marks done only what the old cluster had done; a new leader
// then reads everything else.
func (m *model) move(t *testing.T, ctx context.Context) {
	t.Helper()
	m.moveAt = -1
	began := time.Now()
	if m.horizon != nil {
		m.holdHorizon(t, ctx) // the report's connection is the old cluster's
	}
	stop := modelStops[m.rng.IntN(len(modelStops))]
	if stop == "stopped" {
		m.loop.checkpoint(ctx, m.epoch, true) // a SIGTERM's drain saves what the loop confirmed
	}
	doneAtDump := m.doneIDs(t)
	// The premise below needs a busy old cluster. On a stack started
	// moments ago (CI's) its counter may still be near a fresh initdb's:
	// subtransactions that each write, and so take an id, move it on.
	m.b.Exec(t, `DO $$ BEGIN
	  CREATE TEMP TABLE xid_burn (i int) ON COMMIT DROP;
	  FOR i IN 1 .. 3000 - pg_snapshot_xmax(pg_current_snapshot())::text::bigint LOOP
	    BEGIN INSERT INTO xid_burn VALUES (i); EXCEPTION WHEN others THEN NULL; END;
	  END LOOP; END $$`)
	oldNext := m.b.Int(t, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint`)
	move := harness.StartMove(t, m.b.DB)
	if stop == "stopped after the dump" {
		// What it sends now reaches the engine; its acks stay behind in
		// the old cluster.
		for range 1 + m.rng.IntN(3) {
			m.round(t, ctx)
		}
		m.loop.checkpoint(ctx, m.epoch, true)
	}
	dst := move.Finish(t, m.roles.owner, m.roles.runtime)
	newNext := dst.Int(t, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint`)
	require.Greater(t, oldNext, newNext+100, "the premise: the new cluster's transaction counter is behind the old one's")
	// The test's own table is read by its trigger as the runtime role;
	// pg_dump --no-privileges left its grant behind.
	dst.Exec(t, `GRANT SELECT ON model_refuse TO PUBLIC`)
	m.b = runtimeBundle(t, dst, m.roles.runtime)
	m.loop = nil
	m.logf("the leader %s; the database moved to a new cluster in %s (counter %d, the old one's %d)", stop,
		time.Since(began).Round(time.Millisecond), newNext, oldNext)

	m.insert(t, 1+m.rng.IntN(12))
	m.refusedThenRebased(t, ctx)
	var unread []string
	for id := range m.doneIDs(t) {
		if e := m.byID[id]; !doneAtDump[id] {
			unread = append(unread, fmt.Sprintf("%d (%s %s v%v)", id, key(e.proj, e.entity), e.op, e.order()))
		}
	}
	require.Empty(t, unread, "events done after the rebase that were not done in the old cluster: done unread")
	m.epoch = int64(m.b.Int(t, `SELECT max(epoch)::int FROM outbox_leader`)) + 1
	m.newLeader(t)
}

// refusedThenRebased checks that a replica, reading where the queue's
// positions belong as the runtime role, refuses to lead on the new cluster
// and names the command; then runs the command's rebase as the owner, as
// the runbook has the operator do; then a replica may lead.
func (m *model) refusedThenRebased(t *testing.T, ctx context.Context) {
	t.Helper()
	home, err := outbox.CheckHome(ctx, m.b.Store.Pool)
	require.NoError(t, err)
	require.Contains(t, home.Problem(), "another Postgres cluster", "a replica refuses to lead on the moved database")
	require.Contains(t, home.Problem(), "wlproj queue rebase")
	shownDone := m.b.Int(t, `SELECT count(*)::int FROM outbox_event_states WHERE status = 'done'`)

	conn, err := pgx.Connect(ctx, m.b.Login(t, m.roles.owner, harness.OwnerPassword))
	require.NoError(t, err)
	defer conn.Close(ctx)
	res, err := outbox.Rebase(ctx, conn, outbox.RebaseRequest{By: "model", Why: "moved to a new cluster", Page: 1 + m.rng.IntN(50)})
	require.NoError(t, err)
	home, err = outbox.CheckHome(ctx, m.b.Store.Pool)
	require.NoError(t, err)
	require.Empty(t, home.Problem(), "after the rebase a replica leads on the new cluster")
	m.logf("a replica refused to lead (the view showed %d done); rebased: %d done, %d pending, %d left queued",
		shownDone, res.Done, res.Pending, res.Left)
	t.Log(strings.Join(m.log[len(m.log)-3:], "; ")) // which seeds moved, and how, shows in -v
}

// doneIDs are the events the outbox shows done.
func (m *model) doneIDs(t *testing.T) map[int64]bool {
	t.Helper()
	done := map[int64]bool{}
	for _, id := range harness.Column[int64](t, m.b.DB, `SELECT id FROM outbox_event_states WHERE status = 'done'`) {
		done[id] = true
	}
	return done
}

package rebuild

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
)

// testLeader is the leader name the simulated leaders of these tests lead under.
const testLeader = "rebuild-test"

// takeLead records holder as the new leader of testLeader, as an election
// does, and returns its epoch.
func (b bundle) takeLead(t *testing.T, holder string) int64 {
	t.Helper()
	var epoch int64
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, outbox.BumpEpochSQL, testLeader, holder).Scan(&epoch))
	return epoch
}

// dualWrite is a leader's DualWrite for the bundle's alias, as worker owner.
func (b bundle) dualWrite(t *testing.T, owner string) *DualWrite {
	t.Helper()
	search, err := projection.NewSearch(projection.SearchConfig{Client: b.client, Index: b.alias})
	require.NoError(t, err)
	return NewDualWrite(b.db.Pool, projection.SearchName, search, owner, testLeader, zerolog.Nop())
}

// lead runs d's rounds as the leader of epoch until the test stops it,
// as the elector runs the service during a term.
func lead(t *testing.T, d *DualWrite, epoch int64) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.Run(ctx, epoch, make(chan struct{}))
	}()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return stop
}

// TestDualWriteConfirmsAndForgets: the leader's round sees an open rebuild
// of its alias, hands its indexes to the handler and confirms in the row
// with its epoch; a rebuild of another alias is ignored and never
// confirmed; a deposed leader cannot confirm; a closed rebuild is
// forgotten within CacheTTL.
func TestDualWriteConfirmsAndForgets(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	d := b.dualWrite(t, "w1")
	open := func(alias string) int64 {
		return int64(b.db.Int(t, `INSERT INTO outbox_rebuilds (projection, alias, target_index, old_index, source_table, mode, started_by, reason)
			VALUES ('search', $1, $1 || '-new', $1 || '-old', 'search_index', 'bulk', 'alice', 'test') RETURNING id`, alias))
	}
	epoch := b.takeLead(t, "w1")

	other := open("another-alias")
	require.NoError(t, d.runOnce(b.ctx, epoch))
	got, err := d.RebuildIndexes(b.ctx)
	require.NoError(t, err)
	require.Zero(t, got, "a rebuild of another alias is not this handler's")
	require.Zero(t, b.db.Int(t, `SELECT count(*) FROM outbox_rebuilds WHERE dual_write_at IS NOT NULL`))
	b.db.Exec(t, `UPDATE outbox_rebuilds SET state = 'aborted' WHERE id = $1`, other)

	id := open(b.alias)
	require.NoError(t, d.runOnce(b.ctx, epoch-1), "a deposed leader's round")
	require.Zero(t, b.db.Int(t, `SELECT count(*) FROM outbox_rebuilds WHERE id = $1 AND dual_write_at IS NOT NULL`, id),
		"a deposed leader confirmed")
	require.NoError(t, d.runOnce(b.ctx, epoch))
	got, err = d.RebuildIndexes(b.ctx)
	require.NoError(t, err)
	require.Equal(t, projection.Rebuilding{Target: b.alias + "-new", Old: b.alias + "-old"}, got)
	require.Equal(t, 1, b.db.Int(t, `SELECT count(*) FROM outbox_rebuilds WHERE id = $1 AND dual_write_at IS NOT NULL
		AND dual_write_by = 'w1' AND dual_write_epoch = $2 AND dual_write_leader = $3 AND dual_write_since IS NOT NULL`,
		id, epoch, testLeader))
	since := b.db.Int(t, `SELECT extract(epoch FROM dual_write_since)::int FROM outbox_rebuilds WHERE id = $1`, id)

	// The next term's leader continues the run of confirmations; a term
	// that skipped one starts it again.
	next := b.takeLead(t, "w1")
	require.NoError(t, d.runOnce(b.ctx, next))
	require.Equal(t, 1, b.db.Int(t, `SELECT count(*) FROM outbox_rebuilds WHERE id = $1 AND dual_write_epoch = $2
		AND extract(epoch FROM dual_write_since)::int = $3`, id, next, since), "the next term goes on with the run")
	b.db.Exec(t, `UPDATE outbox_rebuilds SET dual_write_since = dual_write_since - interval '1 hour' WHERE id = $1`, id)
	b.takeLead(t, "w2") // confirms nothing
	skipped := b.takeLead(t, "w1")
	require.NoError(t, d.runOnce(b.ctx, skipped))
	require.Equal(t, 1, b.db.Int(t, `SELECT count(*) FROM outbox_rebuilds WHERE id = $1 AND dual_write_epoch = $2
		AND dual_write_since > now() - interval '1 minute'`, id, skipped), "a term without a confirmation breaks the run")

	// After the swap the old index goes on being written, for a rollback,
	// until --cleanup releases it.
	b.db.Exec(t, `UPDATE outbox_rebuilds SET state = 'swapped' WHERE id = $1`, id)
	harness.Eventually(t, 2*CacheTTL+time.Second, "the handler to see the swap", func() bool {
		got, err := d.RebuildIndexes(b.ctx)
		return err == nil && got == projection.Rebuilding{Target: b.alias + "-new", Old: b.alias + "-old", Swapped: true}
	})
	b.db.Exec(t, `UPDATE outbox_rebuilds SET released_at = now() WHERE id = $1`, id)
	harness.Eventually(t, 2*CacheTTL+time.Second, "the handler to forget the released rebuild", func() bool {
		got, err := d.RebuildIndexes(b.ctx)
		return err == nil && got == projection.Rebuilding{}
	})
}

// TestRebuildSwapNeedsTheCurrentLeader is the failover of the issue: the
// rebuild opens, leader A confirms and the load runs; A loses leadership
// to B, which has not confirmed: the swap is refused, the alias untouched.
// Once B confirms, the same command swaps.
func TestRebuildSwapNeedsTheCurrentLeader(t *testing.T) {
	t.Parallel()
	const rows = 2000
	b := setup(t, rows)
	require.NoError(t, harness.CreateIndex(b.ctx, b.base, b.alias))
	cfg := b.config(t)
	cfg.ConfirmTimeout = time.Second
	stopA := lead(t, b.dualWrite(t, "A"), b.takeLead(t, "A"))

	var epochB int64
	cfg.Progress = &onRows{n: rows / 2, do: func() {
		stopA()
		epochB = b.takeLead(t, "B")
	}}
	_, err := Run(b.ctx, cfg)
	var stopped *StoppedError
	require.ErrorAs(t, err, &stopped)
	var unconfirmed *UnconfirmedError
	require.ErrorAs(t, err, &unconfirmed)
	require.ErrorContains(t, err, "the current leader (epoch "+strconv.FormatInt(epochB, 10)+", worker B) has not confirmed dual-writes to "+
		stopped.Row.Target)
	require.Equal(t, named{Indexes: []string{b.alias}, Concrete: true}, b.resolve(t), "the alias is untouched")
	open, err := Open(b.ctx, b.db.Pool, projection.SearchName)
	require.NoError(t, err)
	require.NotNil(t, open)
	require.Equal(t, int64(rows), open.RowsLoaded, "the load finished")

	lead(t, b.dualWrite(t, "B"), epochB)
	notes := &notes{}
	cfg.Progress = notes
	rep, err := Run(b.ctx, cfg)
	require.NoError(t, err)
	require.True(t, rep.Resumed)
	require.Equal(t, []string{open.Target}, b.resolve(t).Indexes)
	require.False(t, notes.has("loading all rows again"), "A's and B's terms follow each other: nothing to load again")
	require.Equal(t, 1, b.db.Int(t, `SELECT count(*) FROM outbox_rebuilds WHERE id = $1 AND state = 'swapped'
		AND dual_write_by = 'B' AND dual_write_epoch = $2`, open.ID, epochB))
}

// TestRebuildReloadsAfterAnUnconfirmedTerm: a leader term in which no one
// confirmed dual-writes (an older binary, another ELASTIC_INDEX) may have
// left events out of the new index: even once the next leader confirms,
// the rebuild loads every row again before it swaps.
func TestRebuildReloadsAfterAnUnconfirmedTerm(t *testing.T) {
	t.Parallel()
	const rows = 2000
	b := setup(t, rows)
	require.NoError(t, harness.CreateIndex(b.ctx, b.base, b.alias))
	cfg := b.config(t)
	cfg.ConfirmTimeout = time.Second
	stopA := lead(t, b.dualWrite(t, "A"), b.takeLead(t, "A"))
	cfg.Progress = &onRows{n: rows / 2, do: func() {
		stopA()
		b.takeLead(t, "old-binary")
	}}
	_, err := Run(b.ctx, cfg)
	var unconfirmed *UnconfirmedError
	require.ErrorAs(t, err, &unconfirmed)

	lead(t, b.dualWrite(t, "C"), b.takeLead(t, "C"))
	notes := &notes{}
	cfg.Progress = notes
	rep, err := Run(b.ctx, cfg)
	require.NoError(t, err)
	require.True(t, notes.has("loading all rows again"), "every row loaded again: %v", notes.list)
	require.Equal(t, []string{rep.Rebuild.Target}, b.resolve(t).Indexes)
	require.Equal(t, rows, b.count(t, b.alias))
}

// onRows is a Progress that calls do once n rows are done.
type onRows struct {
	noProgress
	n    int64
	done int64
	do   func()
}

func (o *onRows) Add(n int64) {
	before := o.done
	o.done += n
	if before < o.n && o.done >= o.n {
		o.do()
	}
}

// notes is a Progress that keeps the notes.
type notes struct {
	noProgress
	mu   sync.Mutex
	list []string
}

func (n *notes) Note(msg string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.list = append(n.list, msg)
}

func (n *notes) has(part string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, m := range n.list {
		if strings.Contains(m, part) {
			return true
		}
	}
	return false
}

// TestRebuildRefusesAnAliasMovedMeanwhile: the alias came to name another
// index while the rebuild loaded (a replica created the missing index
// behind it): the swap would leave the alias on two indexes, so the
// rebuild stops and changes nothing.
func TestRebuildRefusesAnAliasMovedMeanwhile(t *testing.T) {
	t.Parallel()
	const rows = 2000
	b := setup(t, rows)
	cfg := b.config(t)
	lead(t, b.dualWrite(t, "A"), b.takeLead(t, "A"))
	other := b.alias + "-other"
	cfg.Progress = &onRows{n: rows / 2, do: func() {
		require.NoError(t, harness.ES(b.ctx, b.base, http.MethodPut, "/"+other, []byte(`{"aliases": {"`+b.alias+`": {}}}`), nil))
	}}
	_, err := Run(b.ctx, cfg)
	var stopped *StoppedError
	require.ErrorAs(t, err, &stopped)
	require.ErrorContains(t, err, b.alias+" names ["+other+"] now, not nothing as when rebuild #1 opened")
	require.Equal(t, named{Indexes: []string{other}}, b.resolve(t))
}

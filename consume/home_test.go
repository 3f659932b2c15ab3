package consume

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
)

// sentSet records which entities a projection was sent, and how often.
type sentSet struct {
	mu   sync.Mutex
	sent map[string]int
}

func (s *sentSet) handler() latestFunc {
	return latestFunc{func(_ context.Context, e outbox.Event) projection.Result {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.sent[e.EntityID]++
		return projection.Result{}
	}}
}

func (s *sentSet) count(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sent[id]
}

// insertBooks inserts one queued event per entity, each in a transaction
// of its own (each takes its own xid).
func insertBooks(t *testing.T, db harness.DB, prefix string, n int) {
	t.Helper()
	for i := range n {
		db.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version) VALUES ('book', $1, 'upsert', 1)`,
			fmt.Sprintf("%s%d", prefix, i))
	}
}

// drainWith runs a loop of store until runOnce finds nothing.
func drainWith(t *testing.T, store *outbox.Store, epoch int64, h projection.Handler) {
	t.Helper()
	loop, err := NewLoop(Config{BulkSize: 7}, store, projection.Registry{"search": h}, zerolog.Nop())
	require.NoError(t, err)
	for range 100 {
		res, err := loop.runOnce(context.Background(), epoch)
		require.NoError(t, err)
		if res == (BatchResult{}) {
			return
		}
	}
	t.Fatal("the loop never ran dry")
}

// A database dumped and restored into another cluster, whose transaction
// counter is far below the old one's: the saved positions count the old
// cluster's transactions, so every event inserted in the new one lies
// behind them and shows done unread (the bug). CheckHome names the move
// and the command; the rebase settles what the old positions confirmed as
// done, and every other event, copied or new, is then sent; nothing the
// old leader confirmed is sent again.
func TestQueueMovedToAnotherClusterIsRebased(t *testing.T) {
	t.Parallel()
	src := setup(t)
	old := &sentSet{sent: map[string]int{}}
	insertBooks(t, src.DB, "sent", 12)
	drainWith(t, src.Store, 1, old.handler())
	insertBooks(t, src.DB, "ahead", 6) // queued, never read in the old cluster

	pair := harness.StartPGAlone(t)
	dst := pair.RestoreInto(t, src.DB)
	require.Greater(t, src.Int(t, `SELECT pg_current_xact_id()::text::bigint`), dst.Int(t, `SELECT pg_current_xact_id()::text::bigint`)+100,
		"the premise: the new cluster's counter is behind the old one's")

	home, err := outbox.CheckHome(context.Background(), dst.Pool)
	require.NoError(t, err)
	require.Contains(t, home.Problem(), "another Postgres cluster")
	require.Contains(t, home.Problem(), "wlproj queue rebase")
	insertBooks(t, dst, "new", 5)
	require.Equal(t, 5, dst.Int(t, `SELECT count(*)::int FROM outbox_event_states WHERE entity_id LIKE 'new%' AND status = 'done'`),
		"what the check prevents: the new events lie behind the old positions, done unread")

	conn, err := pgx.Connect(context.Background(), dst.URL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	dry, err := outbox.Rebase(context.Background(), conn, outbox.RebaseRequest{By: "ops", Why: "moved", DryRun: true})
	require.NoError(t, err)
	require.Equal(t, 0, dst.Int(t, `SELECT count(*)::int FROM outbox_replay_audit WHERE action = 'rebase'`), "the dry run changes nothing")
	res, err := outbox.Rebase(context.Background(), conn, outbox.RebaseRequest{By: "ops", Why: "moved", Page: 4})
	require.NoError(t, err)
	require.Equal(t, []int64{12, 11, 0}, []int64{res.Done, res.Pending, res.Left}, "done as the old positions said; the rest to send")
	require.Equal(t, []int64{res.Done, res.Pending, res.Left}, []int64{dry.Done, dry.Pending, dry.Left}, "the dry run counted the same")
	home, err = outbox.CheckHome(context.Background(), dst.Pool)
	require.NoError(t, err)
	require.Empty(t, home.Problem())

	insertBooks(t, dst, "after", 4)
	moved := &sentSet{sent: map[string]int{}}
	dstOutbox := harness.Outbox{DB: dst, Store: &outbox.Store{Pool: dst.Pool, Owner: "w1", LeaderName: "test"}}
	dstOutbox.Lead(t, 10)
	drainWith(t, dstOutbox.Store, 10, moved.handler())
	for i := range 12 {
		require.Zero(t, moved.count(fmt.Sprintf("sent%d", i)), "confirmed in the old cluster: not sent again")
	}
	for prefix, n := range map[string]int{"ahead": 6, "new": 5, "after": 4} {
		for i := range n {
			require.Equal(t, 1, moved.count(fmt.Sprintf("%s%d", prefix, i)), "%s%d sent once", prefix, i)
		}
	}
	require.Equal(t, 27, dst.Int(t, `SELECT count(*)::int FROM outbox_event_states WHERE status = 'done'`), "every event done")
	require.Equal(t, 27, dst.Int(t, `SELECT count(DISTINCT entity_id)::int FROM outbox_ledger`), "each event in the ledger")
}

// A producer that writes xid itself: NULL was never read (pending for
// ever, in no backlog), and a value copied from an older row lay behind
// the position (done, never sent). The column is wlproj's: whatever the
// producer writes, the row carries its own transaction's id and is sent.
func TestProducerWrittenXidIsIgnored(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sent := &sentSet{sent: map[string]int{}}
	insertBooks(t, b.DB, "first", 3)
	drainWith(t, b.Store, 1, sent.handler())
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, xid) VALUES ('book', 'null-xid', 'upsert', NULL)`)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, xid)
	           SELECT 'book', 'copied-xid', 'upsert', xid FROM outbox_events WHERE entity_id = 'first0'`)
	require.Zero(t, b.Count(t, `xid IS NULL OR (entity_id = 'copied-xid' AND xid = (SELECT xid FROM outbox_events WHERE entity_id = 'first0'))`),
		"the trigger stamped both")
	drainWith(t, b.Store, 1, sent.handler())
	require.Equal(t, 1, sent.count("null-xid"))
	require.Equal(t, 1, sent.count("copied-xid"))
	require.Equal(t, 5, b.Int(t, `SELECT count(*)::int FROM outbox_event_states WHERE status = 'done'`))
}

package outbox_test

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
)

// The horizon tests are not parallel (but the one that makes walsenders and
// slots, on a cluster of its own): a test that expects no holder must not
// run beside one that makes one.

// horizonNow reads the horizon, failing the test on an error.
func horizonNow(t *testing.T, q outbox.Querier) outbox.Horizon {
	t.Helper()
	h, err := outbox.ReadHorizon(context.Background(), q)
	require.NoError(t, err)
	return h
}

// waitHorizon waits until the horizon's holder is of kind.
func waitHorizon(t *testing.T, q outbox.Querier, kind string) outbox.Horizon {
	t.Helper()
	var h outbox.Horizon
	harness.Eventually(t, 10*time.Second, "the horizon held by "+kind, func() bool {
		h = horizonNow(t, q)
		return h.Kind() == kind
	})
	return h
}

// burnXids commits n transactions that take a transaction id each, so the
// xids held before are n older than those taken after.
func burnXids(t *testing.T, db harness.DB, n int) {
	t.Helper()
	for range n {
		db.Exec(t, `SELECT txid_current()`)
	}
}

// The oldest of a session's snapshot and a prepared transaction is named
// with its kind, and the next one once it ends; none once both end.
func TestHorizonNamesTheOldestHolder(t *testing.T) {
	db := harness.NewDatabase(t)
	require.Equal(t, outbox.HolderNone, horizonNow(t, db.Pool).Kind(), "nothing holds the horizon of a fresh database")

	report := harness.HoldSnapshot(t, db.URL, "app-report")
	burnXids(t, db, 3)
	gid := harness.UniqueName("hz_")
	harness.PrepareTransaction(t, db, gid)
	burnXids(t, db, 2)

	h := horizonNow(t, db.Pool)
	require.NotNil(t, h.Holder)
	require.Equal(t, outbox.HorizonHolder{Kind: outbox.HolderBackend, PID: report.PID, Application: "app-report",
		State: "idle in transaction", Xid: h.Holder.Xid, XidAge: h.Holder.XidAge, Since: h.Holder.Since}, *h.Holder)
	require.False(t, h.Holder.Wlproj())
	require.GreaterOrEqual(t, h.Holder.XidAge, int64(6), "three xids, the prepared one and two more were taken since")
	require.Equal(t, outbox.AgeFromPostgres, h.AgeBasis)
	require.False(t, h.Holder.Since.IsZero())
	require.Equal(t, h.TakenAt.Sub(h.Holder.Since), h.Age)

	report.Release()
	h = waitHorizon(t, db.Pool, outbox.HolderPrepared)
	require.Equal(t, gid, h.Holder.Name)
	require.Equal(t, "prepared", h.Holder.State)
	require.Zero(t, h.Holder.PID)
	require.GreaterOrEqual(t, h.Holder.XidAge, int64(2))
	require.Equal(t, outbox.AgeFromPostgres, h.AgeBasis)

	db.Exec(t, `ROLLBACK PREPARED '`+gid+`'`)
	waitHorizon(t, db.Pool, outbox.HolderNone)
	require.Zero(t, horizonNow(t, db.Pool).Age)
}

// A READ COMMITTED transaction that wrote holds no snapshot between its
// statements, but its own transaction id holds the horizon all the same.
func TestHorizonSeesAnIdleTransactionThatWrote(t *testing.T) {
	db := harness.NewDatabase(t)
	ctx := context.Background()
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `BEGIN`)
	require.NoError(t, err)
	// The simple protocol, as psql: no portal is left open to hold a snapshot.
	_, err = conn.Exec(ctx, `SELECT txid_current()`)
	require.NoError(t, err)
	burnXids(t, db, 2)
	var xid int64
	var xmin *string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT backend_xid::text::bigint, backend_xmin::text FROM pg_stat_activity WHERE pid = $1`,
		conn.Conn().PgConn().PID()).Scan(&xid, &xmin))
	require.Nil(t, xmin, "idle, it holds no snapshot")

	h := horizonNow(t, db.Pool)
	require.Equal(t, outbox.HolderBackend, h.Kind())
	require.Equal(t, int32(conn.Conn().PgConn().PID()), h.Holder.PID)
	require.Equal(t, xid, h.Holder.Xid)
	require.GreaterOrEqual(t, h.Holder.XidAge, int64(2))
	_, err = conn.Exec(ctx, `ROLLBACK`)
	require.NoError(t, err)
	waitHorizon(t, db.Pool, outbox.HolderNone)
}

// A wlproj session is told apart by its application_name.
func TestHorizonTellsWlprojSessionsApart(t *testing.T) {
	db := harness.NewDatabase(t)
	own := harness.HoldSnapshot(t, db.URL, "wlproj-leader:w1")
	h := horizonNow(t, db.Pool)
	require.Equal(t, own.PID, h.Holder.PID)
	require.True(t, h.Holder.Wlproj())
}

// The runtime role of roles.sql, without pg_read_all_stats, sees who holds
// the horizon and how many transactions ago, but not since when or in what
// state for another role's session: a HorizonWatch measures that age by
// seeing it. Its own role's sessions it sees whole.
func TestHorizonAsTheRuntimeRole(t *testing.T) {
	owner, runtime := harness.Roles(t, "hz")
	db := harness.NewDatabase(t)
	out, err := harness.ApplyRoles(t, db.URL, db.Name, owner, runtime)
	require.NoError(t, err, out)
	runtimeURL := db.Login(t, runtime, harness.RuntimePassword)
	pool, err := pgxpool.New(context.Background(), runtimeURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	admins := harness.HoldSnapshot(t, db.URL, "pg_dump")
	burnXids(t, db, 2)
	h := horizonNow(t, pool)
	require.Equal(t, outbox.HolderBackend, h.Kind())
	require.Equal(t, admins.PID, h.Holder.PID)
	require.Equal(t, "pg_dump", h.Holder.Application)
	require.GreaterOrEqual(t, h.Holder.XidAge, int64(2))
	require.Empty(t, h.Holder.State, "another role's state is hidden")
	require.Equal(t, outbox.AgeUnknown, h.AgeBasis)

	var w outbox.HorizonWatch
	first, err := w.Read(context.Background(), pool)
	require.NoError(t, err)
	require.Equal(t, outbox.AgeObserved, first.AgeBasis)
	time.Sleep(1100 * time.Millisecond)
	later, err := w.Read(context.Background(), pool)
	require.NoError(t, err)
	require.Equal(t, outbox.AgeObserved, later.AgeBasis)
	require.GreaterOrEqual(t, later.Age, time.Second, "seen for a second")

	admins.Release()
	own := harness.HoldSnapshot(t, runtimeURL, "wlproj-cli")
	harness.Eventually(t, 10*time.Second, "the runtime role's own session holds it", func() bool {
		h = horizonNow(t, pool)
		return h.Holder != nil && h.Holder.PID == own.PID
	})
	require.Equal(t, "idle in transaction", h.Holder.State)
	require.Equal(t, outbox.AgeFromPostgres, h.AgeBasis)
	require.True(t, h.Holder.Wlproj())
	own.Release()
	waitHorizon(t, pool, outbox.HolderNone)
	_, err = w.Read(context.Background(), pool)
	require.NoError(t, err)
}

// A standby with hot_standby_feedback holds the primary's horizon through
// its walsender, or through its slot, which keeps holding it after the
// standby disconnects. The runtime role sees both.
//
// It runs on a cluster of its own: a walsender's feedback and a slot hold
// back every database of their cluster, and the stack's is shared by every
// package's tests at once (the topology test's VACUUM failed beside it).
func TestHorizonSeesStandbysAndSlots(t *testing.T) {
	t.Parallel()
	pair := harness.StartPGPair(t)
	owner, runtime := harness.Roles(t, "hzs")
	db := pair.NewDatabase(t, pair.URL([]string{pair.Primary.Addr()}))
	out, err := harness.ApplyRoles(t, db.URL, db.Name, owner, runtime)
	require.NoError(t, err, out)
	pool, err := pgxpool.New(context.Background(), db.Login(t, runtime, harness.RuntimePassword))
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	standby := standbyFeedback(t, db, "")
	burnXids(t, db, 2)
	h := waitHorizon(t, pool, outbox.HolderWalsender)
	require.Equal(t, standby.pid, h.Holder.PID)
	require.Equal(t, standby.xmin, h.Holder.Xid)
	require.GreaterOrEqual(t, h.Holder.XidAge, int64(2))
	standby.close()
	waitHorizon(t, pool, outbox.HolderNone)

	slot := harness.UniqueName("hz_slot_")
	db.Exec(t, `SELECT pg_create_physical_replication_slot($1, true)`, slot)
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, slot) })
	require.Equal(t, outbox.HolderNone, horizonNow(t, pool).Kind(), "a slot holds no xmin until a standby sends feedback")
	standby = standbyFeedback(t, db, slot)
	h = waitHorizon(t, pool, outbox.HolderSlot)
	require.Equal(t, slot, h.Holder.Name)
	require.Equal(t, "active", h.Holder.State)
	require.Equal(t, standby.pid, h.Holder.PID)
	require.Equal(t, standby.xmin, h.Holder.Xid)

	standby.close()
	harness.Eventually(t, 10*time.Second, "the slot holds it without its standby", func() bool {
		h = horizonNow(t, pool)
		return h.Kind() == outbox.HolderSlot && h.Holder.State == "inactive"
	})
	require.Equal(t, standby.xmin, h.Holder.Xid)
	db.Exec(t, `SELECT pg_drop_replication_slot($1)`, slot)
	waitHorizon(t, pool, outbox.HolderNone)
}

// walFeedback is a replication connection that sent a standby's
// hot_standby_feedback.
type walFeedback struct {
	pid   int32
	xmin  int64
	close func()
}

// standbyFeedback streams WAL from db's server as a physical standby would,
// through slot when it is not empty, and reports the current snapshot's
// xmin as its oldest query's, as hot_standby_feedback = on does.
func standbyFeedback(t *testing.T, db harness.DB, slot string) walFeedback {
	t.Helper()
	ctx := context.Background()
	var lsn string
	var xmin8 uint64
	require.NoError(t, db.Pool.QueryRow(ctx,
		`SELECT pg_current_wal_flush_lsn()::text, pg_snapshot_xmin(pg_current_snapshot())::text::bigint`).Scan(&lsn, &xmin8))
	cfg, err := pgconn.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.RuntimeParams["replication"] = "true"
	cfg.RuntimeParams["application_name"] = "standby"
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	require.NoError(t, err)

	start := "START_REPLICATION PHYSICAL " + lsn
	if slot != "" {
		start = "START_REPLICATION SLOT " + slot + " PHYSICAL " + lsn
	}
	conn.Frontend().Send(&pgproto3.Query{String: start})
	require.NoError(t, conn.Frontend().Flush())
	for {
		msg, err := conn.ReceiveMessage(ctx)
		require.NoError(t, err)
		if e, ok := msg.(*pgproto3.ErrorResponse); ok {
			t.Fatalf("%s: %s", start, e.Message)
		}
		if _, ok := msg.(*pgproto3.CopyBothResponse); ok {
			break
		}
	}
	conn.Frontend().Send(&pgproto3.CopyData{Data: hotStandbyFeedback(xmin8)})
	require.NoError(t, conn.Frontend().Flush())

	// Read and drop the WAL it streams, so the walsender never blocks.
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if _, err := conn.ReceiveMessage(rctx); err != nil {
				return
			}
		}
	}()
	f := walFeedback{pid: int32(conn.PID()), xmin: int64(xmin8 & 0xffffffff)}
	var closed bool
	f.close = func() {
		if closed {
			return
		}
		closed = true
		stop()
		<-done
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := conn.Close(cctx); err != nil && !errors.Is(err, context.Canceled) {
			t.Logf("close replication connection: %v", err)
		}
	}
	t.Cleanup(f.close)
	return f
}

// hotStandbyFeedback is the standby's 'h' message: the clock, then its
// xmin and epoch, with no catalog xmin.
func hotStandbyFeedback(xid8 uint64) []byte {
	msg := make([]byte, 0, 25)
	msg = append(msg, 'h')
	msg = binary.BigEndian.AppendUint64(msg, uint64(time.Since(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)).Microseconds()))
	msg = binary.BigEndian.AppendUint32(msg, uint32(xid8))
	msg = binary.BigEndian.AppendUint32(msg, uint32(xid8>>32))
	msg = binary.BigEndian.AppendUint32(msg, 0)
	msg = binary.BigEndian.AppendUint32(msg, 0)
	return msg
}

// The statistics of the outbox and the ledger show dead rows that a held
// snapshot keeps from vacuum, and vacuum removing them once it ends.
func TestHorizonReadsTheOutboxAndLedgerStatistics(t *testing.T) {
	b := setup(t)
	b.insert(t, 500)
	holder := harness.HoldSnapshot(t, b.URL, "app-report")
	b.Exec(t, `DELETE FROM outbox_events`)
	b.Exec(t, `VACUUM outbox_events`)
	var h outbox.Horizon
	harness.Eventually(t, 10*time.Second, "500 dead rows reported", func() bool {
		h = horizonNow(t, b.Pool)
		return len(h.Tables) == 2 && h.Tables[0].Dead == 500
	})
	require.Equal(t, []string{"outbox_events", "outbox_ledger"}, []string{h.Tables[0].Table, h.Tables[1].Table})
	require.Zero(t, h.Tables[0].Live)

	holder.Release()
	waitHorizon(t, b.Pool, outbox.HolderNone)
	b.Exec(t, `VACUUM outbox_events`)
	harness.Eventually(t, 10*time.Second, "vacuum removed them", func() bool {
		return horizonNow(t, b.Pool).Tables[0].Dead == 0
	})
}

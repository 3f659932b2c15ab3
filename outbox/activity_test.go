package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
)

func TestActivityBuckets(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	// Done 0, 5 and 70 minutes ago (the last out of the window); failed and
	// discarded 5 minutes ago; a pending row, which counts nowhere.
	b.Exec(t, `
		INSERT INTO outbox_events (entity_type, entity_id, op, status, processed_at, updated_at)
		VALUES ('book', '1', 'upsert', 'done', now(), now()),
		       ('book', '2', 'upsert', 'done', now() - interval '5 minutes', now()),
		       ('book', '3', 'upsert', 'done', now() - interval '5 minutes', now()),
		       ('book', '4', 'upsert', 'done', now() - interval '70 minutes', now()),
		       ('book', '5', 'upsert', 'failed', NULL, now() - interval '5 minutes'),
		       ('book', '6', 'upsert', 'discarded', NULL, now() - interval '5 minutes'),
		       ('book', '7', 'upsert', 'pending', NULL, now())`)
	buckets, err := outbox.Activity(ctx, b.Pool, time.Hour, time.Minute)
	require.NoError(t, err)
	require.Len(t, buckets, 60)
	var done, failed int64
	for i, bk := range buckets {
		done += bk.Done
		failed += bk.Failed
		if i > 0 {
			require.Equal(t, time.Minute, bk.At.Sub(buckets[i-1].At))
		}
	}
	require.Equal(t, int64(3), done)
	require.Equal(t, int64(2), failed)
	require.Equal(t, int64(1), buckets[59].Done, "the last bucket is this minute")
	require.Equal(t, int64(2), buckets[54].Done+buckets[55].Done, "five minutes ago, near a minute's edge")
	require.WithinDuration(t, time.Now(), buckets[59].At, time.Minute)

	_, err = outbox.Activity(ctx, b.Pool, time.Second, time.Minute)
	require.Error(t, err)
}

func TestStuckRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Exec(t, `
		INSERT INTO outbox_events (entity_type, entity_id, op, status, locked_by, claim_token, lease_until, processing_started_at)
		VALUES ('book', 'lease', 'upsert', 'processing', 'w1', 1, now() - interval '1 second', now() - interval '1 minute'),
		       ('book', 'long', 'upsert', 'processing', 'w1', 1, now() + interval '1 hour', now() - interval '10 minutes'),
		       ('book', 'live', 'upsert', 'processing', 'w1', 1, now() + interval '1 hour', now())`)
	rows, err := outbox.Stuck(context.Background(), b.Pool, 5*time.Minute, 10)
	require.NoError(t, err)
	require.Len(t, rows, 2)
	require.Equal(t, []string{"lease", "long"}, []string{rows[0].EntityID, rows[1].EntityID})
	require.Equal(t, "w1", rows[0].LockedBy)
	require.Equal(t, int64(1), *rows[0].ClaimToken)
	rows, err = outbox.Stuck(context.Background(), b.Pool, 0, 10)
	require.NoError(t, err)
	require.Len(t, rows, 1, "without a cap only expired leases")
}

func TestReplicasAndLeaderOf(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	l, err := outbox.LeaderOf(ctx, b.Pool, "test")
	require.NoError(t, err)
	require.Nil(t, l, "no one ever led")

	// Two lock sessions of the name "test", one holding and one waiting, and
	// one of another name.
	lock := func(app, name string) *pgx.Conn {
		cfg, err := pgx.ParseConfig(b.URL)
		require.NoError(t, err)
		cfg.RuntimeParams["application_name"] = app
		conn, err := pgx.ConnectConfig(ctx, cfg)
		require.NoError(t, err)
		// A connection is not safe for concurrent use: the lock's Exec ends
		// (cancelled) before the connection is closed.
		lockCtx, cancel := context.WithCancel(ctx)
		locked := make(chan struct{})
		go func() {
			defer close(locked)
			_, _ = conn.Exec(lockCtx, outbox.LockSQL, name)
		}()
		t.Cleanup(func() {
			cancel()
			<-locked
			conn.Close(context.Background())
		})
		return conn
	}
	lock("holder-a", "test")
	harness.Eventually(t, 5*time.Second, "a holds the lock", func() bool {
		rs, err := outbox.Replicas(ctx, b.Pool, "test")
		return err == nil && len(rs) == 1 && rs[0].Holding
	})
	lock("waiter-b", "test")
	lock("other-c", "other")
	b.Lead(t, 4)
	b.Exec(t, `UPDATE outbox_leader SET holder = 'holder-a'`)
	harness.Eventually(t, 5*time.Second, "b waits", func() bool {
		rs, err := outbox.Replicas(ctx, b.Pool, "test")
		return err == nil && len(rs) == 2
	})
	rs, err := outbox.Replicas(ctx, b.Pool, "test")
	require.NoError(t, err)
	require.Equal(t, []string{"holder-a", "waiter-b"}, []string{rs[0].ApplicationName, rs[1].ApplicationName})
	require.Equal(t, []bool{true, false}, []bool{rs[0].Holding, rs[1].Holding})
	require.False(t, rs[0].Since.IsZero())

	l, err = outbox.LeaderOf(ctx, b.Pool, "test")
	require.NoError(t, err)
	require.Equal(t, []any{"holder-a", int64(4), true}, []any{l.Holder, l.Epoch, l.Active})
}

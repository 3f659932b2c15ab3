package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestTwoPhaseProducerInsertsWithNotifyOff: PREPARE TRANSACTION refuses a
// transaction that ran NOTIFY, which the insert trigger does. A producer
// in a two-phase commit sets wlproj.notify = off for its transaction: it
// prepares, nothing is notified, and once COMMIT PREPARED makes the row
// visible the leader's read by position takes it (its poll, every
// OUTBOX_POLL_INTERVAL_SECONDS, reads without a notification). Without the
// setting the prepare fails as before, and other inserts still notify.
func TestTwoPhaseProducerInsertsWithNotifyOff(t *testing.T) {
	t.Parallel()
	b, origin := queuedBundle(t)
	ctx := context.Background()
	if b.Int(t, `SELECT current_setting('max_prepared_transactions')::int`) == 0 {
		t.Skip("the test Postgres has max_prepared_transactions = 0: PREPARE TRANSACTION is refused whatever the outbox does " +
			"(scripts/stack.sh starts it with max_prepared_transactions=8)")
	}
	listener, err := b.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer listener.Release()
	_, err = listener.Exec(ctx, `LISTEN outbox_events`)
	require.NoError(t, err)
	notified := func() bool {
		wait, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		_, err := listener.Conn().WaitForNotification(wait)
		return err == nil
	}

	gid := "wlproj-test-" + b.Name
	conn, err := pgx.Connect(ctx, b.URL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	// A prepared transaction left behind would hold every database's
	// vacuum horizon until someone ends it.
	t.Cleanup(func() {
		if b.Int(t, `SELECT count(*) FROM pg_prepared_xacts WHERE gid = $1`, gid) > 0 {
			_, err := b.Pool.Exec(context.Background(), `ROLLBACK PREPARED '`+gid+`'`)
			require.NoError(t, err)
		}
	})
	insert := `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', '2pc', 'upsert')`

	_, err = conn.Exec(ctx, `BEGIN; `+insert)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `PREPARE TRANSACTION '`+gid+`'`)
	require.ErrorContains(t, err, "NOTIFY", "without the setting the trigger's NOTIFY refuses the prepare")
	_, err = conn.Exec(ctx, `ROLLBACK`)
	require.NoError(t, err)

	_, err = conn.Exec(ctx, `BEGIN; SET LOCAL wlproj.notify = off; `+insert)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `PREPARE TRANSACTION '`+gid+`'`)
	require.NoError(t, err)
	require.Zero(t, b.Count(t, `entity_id = '2pc'`), "prepared, not committed")
	_, err = conn.Exec(ctx, `COMMIT PREPARED '`+gid+`'`)
	require.NoError(t, err)
	require.False(t, notified(), "a transaction with wlproj.notify = off notifies nothing")

	events, _ := b.read(t, origin, 10)
	require.Equal(t, []string{"2pc"}, entityIDs(events), "the leader's read takes the committed row")

	_, err = conn.Exec(ctx, insert)
	require.NoError(t, err)
	require.True(t, notified(), "other transactions' inserts notify as before")
}

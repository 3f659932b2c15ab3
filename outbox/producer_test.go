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

// producer is an application transaction on a source table of its own
// (books) that writes outbox events with a null event_version, so the
// outbox id orders them.
type producer struct {
	db  harness.DB
	tx  pgx.Tx
	pid int
}

func beginProducer(t *testing.T, db harness.DB) *producer {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	p := &producer{db: db, tx: tx}
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&p.pid))
	return p
}

func (p *producer) update(title string) error {
	_, err := p.tx.Exec(context.Background(), `UPDATE books SET title = $1 WHERE id = '42'`, title)
	return err
}

// event inserts the book's upsert event and returns its outbox id.
func (p *producer) event(t *testing.T, title string) int64 {
	t.Helper()
	var id int64
	require.NoError(t, p.tx.QueryRow(context.Background(), `
		INSERT INTO outbox_events (entity_type, entity_id, op, payload)
		VALUES ('book', '42', 'upsert', jsonb_build_object('title', $1::text)) RETURNING id`, title).Scan(&id))
	return id
}

func (p *producer) commit(t *testing.T) {
	t.Helper()
	require.NoError(t, p.tx.Commit(context.Background()))
}

// updateBlocked starts p's update, waits until it waits for the row lock
// of another transaction, and returns a channel that gets the update's
// result once that lock is released.
func (p *producer) updateBlocked(t *testing.T, title string) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- p.update(title) }()
	harness.Eventually(t, 10*time.Second, "the update waiting for the row lock", func() bool {
		var blocked bool
		require.NoError(t, p.db.Pool.QueryRow(context.Background(),
			`SELECT cardinality(pg_blocking_pids($1)) > 0`, p.pid).Scan(&blocked))
		return blocked
	})
	return done
}

// newest is the title of the book's newest event in the daemon's order
// (version, then outbox id; a null version is the id): what the index ends
// with.
func newest(t *testing.T, db harness.DB) string {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(),
		`SELECT id, event_version, payload->>'title' FROM outbox_events WHERE entity_type = 'book' AND entity_id = '42'`)
	require.NoError(t, err)
	var best *outbox.Applied
	var title string
	for rows.Next() {
		var e outbox.Event
		var got string
		require.NoError(t, rows.Scan(&e.ID, &e.EventVersion, &got))
		if best == nil || best.Before(e.Version(), e.ID) {
			best, title = &outbox.Applied{Version: e.Version(), EventID: e.ID}, got
		}
	}
	require.NoError(t, rows.Err())
	require.NotNil(t, best, "no event of the book")
	return title
}

func source(t *testing.T, db harness.DB) string {
	t.Helper()
	var title string
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT title FROM books WHERE id = '42'`).Scan(&title))
	return title
}

func producerDB(t *testing.T) harness.DB {
	t.Helper()
	db := harness.NewDatabase(t)
	db.Exec(t, `CREATE TABLE books (id text PRIMARY KEY, title text NOT NULL)`)
	db.Exec(t, `INSERT INTO books VALUES ('42', 'zero')`)
	return db
}

// TestProducerEventAfterUpdateOrdersByCommit is README's producer contract
// for a null event_version: insert the event after the UPDATE of the source
// row, in the same transaction. The row lock then orders the two
// transactions' outbox ids as their commits, so the newest event is the
// source row's last value. The counter-example, the event inserted before
// the update, gives the last commit the lower id: the index keeps the
// other transaction's value for good.
func TestProducerEventAfterUpdateOrdersByCommit(t *testing.T) {
	t.Parallel()

	t.Run("update then insert", func(t *testing.T) {
		t.Parallel()
		db := producerDB(t)
		first, second := beginProducer(t, db), beginProducer(t, db)
		require.NoError(t, first.update("first"))
		blocked := second.updateBlocked(t, "second")
		firstID := first.event(t, "first")
		first.commit(t)
		require.NoError(t, <-blocked)
		secondID := second.event(t, "second")
		second.commit(t) // commits last

		require.Greater(t, secondID, firstID, "the last commit has the higher outbox id")
		require.Equal(t, "second", source(t, db))
		require.Equal(t, "second", newest(t, db), "the index ends as the source")
	})

	t.Run("insert then update, the counter-example", func(t *testing.T) {
		t.Parallel()
		db := producerDB(t)
		first, second := beginProducer(t, db), beginProducer(t, db)
		firstID := first.event(t, "first")
		secondID := second.event(t, "second")
		require.NoError(t, second.update("second"))
		blocked := first.updateBlocked(t, "first")
		second.commit(t)
		require.NoError(t, <-blocked)
		first.commit(t) // commits last

		require.Less(t, firstID, secondID, "the last commit has the lower outbox id")
		require.Equal(t, "first", source(t, db))
		require.Equal(t, "second", newest(t, db), "the index disagrees with the source for good")
	})
}

package harness

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestMap(t *testing.T) {
	t.Parallel()
	type event struct{ ID int64 }
	id := func(e event) int64 { return e.ID }
	require.Equal(t, []int64{4, 6}, Map([]event{{4}, {6}}, id))
	require.Equal(t, []int64{}, Map(nil, id), "empty, not nil, as make gives")
}

func TestColumnAndPairs(t *testing.T) {
	t.Parallel()
	db := NewDatabase(t)
	require.Nil(t, Column[int64](t, db, `SELECT id FROM outbox_events`), "no rows: nil, as an appending loop gives")
	require.Equal(t, map[string]int{}, Pairs[string, int](t, db, `SELECT status, count(*) FROM outbox_events GROUP BY status`))

	// Claimed rows (status given): a queued row's status never changes.
	db.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, status) SELECT 'book', g::text, 'upsert', 'pending' FROM generate_series(1, 3) g`)
	db.Exec(t, `UPDATE outbox_events SET status = 'done' WHERE id = 2`)
	require.Equal(t, []int64{3, 2, 1}, Column[int64](t, db, `SELECT id FROM outbox_events ORDER BY id DESC`))
	require.Equal(t, []string{"1", "3"}, Column[string](t, db, `SELECT entity_id FROM outbox_events WHERE status = $1 ORDER BY id`, "pending"))
	require.Equal(t, map[string]int{"pending": 2, "done": 1},
		Pairs[string, int](t, db, `SELECT status, count(*) FROM outbox_events GROUP BY status`))
}

func TestOutboxLeadMovesTheEpoch(t *testing.T) {
	t.Parallel()
	o := NewOutbox(t)
	require.Zero(t, o.Int(t, `SELECT count(*) FROM outbox_leader`), "no one leads until Lead")
	o.Lead(t, 1)
	// A claimed row: the epoch fences the claim's acks.
	o.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, status) VALUES ('book', '1', 'upsert', 'pending')`)
	events, err := o.Store.Claim(context.Background(), 1, 10, time.Minute, nil)
	require.NoError(t, err)
	require.Len(t, events, 1, "w1 claims as the leader of epoch 1")

	o.Lead(t, 2)
	require.Equal(t, 2, o.Int(t, `SELECT epoch FROM outbox_leader WHERE name = 'test' AND holder = 'w1'`))
	acked, err := o.Store.AckDone(context.Background(), 1, events[0].Claim, []int64{events[0].ID}, nil)
	require.NoError(t, err)
	require.Empty(t, acked, "epoch 1 is fenced once the epoch moves")
}

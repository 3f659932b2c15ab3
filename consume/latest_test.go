package consume

import (
	"context"
	"sync"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
)

// recorder is a projection that applies everything and remembers what it
// was sent; latestRecorder is the same, opting in to the ledger.
type recorder struct {
	mu   sync.Mutex
	sent []int64
}

func (r *recorder) Handle(_ context.Context, events []outbox.Event) []projection.Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]projection.Result, len(events))
	for i, e := range events {
		r.sent = append(r.sent, e.ID)
		out[i].ID = e.ID
	}
	return out
}

type latestRecorder struct{ *recorder }

func (latestRecorder) LatestOnly() bool { return true }

// The ledger drops stale events only for a projection that declares
// itself latest-only, and the ack records only that projection's events:
// a timeline gets every event, in any order, and leaves no ledger entry.
func TestLedgerOnlyForLatestOnlyProjections(t *testing.T) {
	t.Parallel()
	b := setup(t)
	index, timeline := &recorder{}, &recorder{}
	loop, err := NewLoop(Config{}, b.Store, projection.Registry{"index": latestRecorder{index}, "timeline": timeline}, zerolog.Nop())
	require.NoError(t, err)
	// A round takes every batch there is: each projection's queued rows are
	// read apart.
	round := func() BatchResult {
		var sum BatchResult
		for {
			res, err := loop.runOnce(context.Background(), 1)
			require.NoError(t, err)
			if res == (BatchResult{}) {
				return sum
			}
			sum.Done, sum.Superseded = sum.Done+res.Done, sum.Superseded+res.Superseded
		}
	}
	insert := func(version int) {
		b.Exec(t, `INSERT INTO outbox_events (projection, entity_type, entity_id, op, event_version)
			VALUES ('index', 'book', '1', 'upsert', $1), ('timeline', 'book', '1', 'upsert', $1)`, version)
	}

	insert(2)
	require.Equal(t, BatchResult{Done: 2}, round())
	insert(1) // older than what both were sent
	require.Equal(t, BatchResult{Done: 2, Superseded: 1}, round())

	require.Equal(t, []int64{1}, index.sent, "the older version never reaches the latest-only projection")
	require.Equal(t, []int64{2, 4}, timeline.sent, "the timeline gets every event")
	require.Equal(t, 1, b.Int(t, `SELECT count(*) FROM outbox_ledger_entries`))
	require.Equal(t, 1, b.Int(t, `SELECT count(*) FROM outbox_ledger_entries WHERE projection = 'index' AND version = 2`))
}

package harness

import (
	"context"
	"encoding/json"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPaceAsksForTheRate(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var total atomic.Int64
	start := time.Now()
	slow := true
	pace(ctx, 1000, 10*time.Millisecond, func(n int) {
		total.Add(int64(n))
		if slow {
			// A stalled insert: the ticks it misses are made up for.
			slow = false
			time.Sleep(100 * time.Millisecond)
		}
	})
	elapsed := time.Since(start).Seconds()
	require.InDelta(t, 1000*elapsed, total.Load(), 25, "1000/s over %.3fs", elapsed)
}

func TestProducerCommitsWhatItCounts(t *testing.T) {
	t.Parallel()
	db := NewDatabase(t)
	p := Produce(context.Background(), db.Pool, ProducerConfig{Rate: 500, Next: books(new(int))})
	time.Sleep(300 * time.Millisecond)
	p.Stop()
	p.Stop() // a second Stop is harmless
	require.NoError(t, p.Err())
	require.Zero(t, p.FailedInserts())
	require.InDelta(t, 150, p.Committed(), 40)
	require.EqualValues(t, p.Committed(), db.Count(t, `entity_type = 'book' AND op = 'upsert' AND scope_key = 'lib-1'`))
}

// books makes upserts of new books numbered on from *next.
func books(next *int) func(n int) []Event {
	return func(n int) []Event {
		events := make([]Event, n)
		for i := range events {
			*next++
			events[i] = Event{EntityType: "book", EntityID: strconv.Itoa(*next), Op: "upsert", Version: 1,
				Payload: json.RawMessage(`{"kind": "book", "title": "t"}`), ScopeKey: "lib-1"}
		}
		return events
	}
}

func TestProducerCountsFailedInserts(t *testing.T) {
	t.Parallel()
	db := NewDatabase(t)
	p := Produce(context.Background(), db.Pool, ProducerConfig{Rate: 200, Next: func(n int) []Event {
		return make([]Event, n) // empty entity types: the table refuses them
	}})
	Eventually(t, 5*time.Second, "a failed insert", func() bool { return p.FailedInserts() > 0 })
	p.Stop()
	require.Error(t, p.Err())
	require.Zero(t, p.Committed())
}

// With Writers, every event is a transaction of its own: as many xids in
// the outbox as rows, where one insert per tick would share one among many.
func TestProducerWritesEachEventAloneWithWriters(t *testing.T) {
	t.Parallel()
	db := NewDatabase(t)
	p := Produce(context.Background(), db.Pool, ProducerConfig{Rate: 500, Writers: 3, Next: books(new(int))})
	time.Sleep(300 * time.Millisecond)
	p.Stop()
	require.NoError(t, p.Err())
	require.Positive(t, p.Committed())
	require.EqualValues(t, p.Committed(), db.Count(t, `true`))
	require.EqualValues(t, p.Committed(), db.Int(t, `SELECT count(DISTINCT xmin::text) FROM outbox_events`),
		"one transaction per event")
}

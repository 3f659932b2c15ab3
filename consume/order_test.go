package consume

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/outbox"
)

func event(id int64, op string, version int64) outbox.Event {
	return outbox.Event{ID: id, Projection: "search", EntityType: "book", EntityID: "r1", Op: op, EventVersion: &version}
}

func claimOf(t *testing.T, o *order, events ...outbox.Event) *flight {
	t.Helper()
	f, err := o.claim(func() ([]outbox.Event, error) { return events, nil })
	require.NoError(t, err)
	return f
}

// A delete in flight and an older upsert claimed behind it: the upsert's
// batch waits for the delete's and then sees it in its ledger entry.
func TestOrderMakesALaterBatchSeeWhatAnEarlierOneApplied(t *testing.T) {
	o := newOrder()
	del := claimOf(t, o, event(2, outbox.OpDelete, 3))
	upsert := claimOf(t, o, event(3, outbox.OpUpsert, 2))
	require.Len(t, upsert.after, 1)

	// While the earlier batch is in flight the later one can only wait: with
	// its context ended, wait returns that instead of going ahead.
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, o.wait(ended, upsert), context.Canceled, "the later batch must wait for the earlier one")
	o.record(del.events)
	o.finish(del)
	require.NoError(t, o.wait(context.Background(), upsert))
	require.Equal(t, &outbox.Applied{Version: 3, EventID: 2, Deleted: true}, upsert.events[0].Applied)
	require.True(t, upsert.events[0].Stale())

	o.finish(upsert)
	require.Empty(t, o.claimed)
	require.Empty(t, o.applied, "nothing is kept once no batch claims the document")
}

func TestOrderLetsBatchesOfOtherDocumentsGoAtOnce(t *testing.T) {
	o := newOrder()
	claimOf(t, o, event(1, outbox.OpUpsert, 1))
	other := event(2, outbox.OpUpsert, 1)
	other.EntityID = "r2"
	f := claimOf(t, o, other)
	require.Empty(t, f.after)
	require.NoError(t, o.wait(context.Background(), f))
}

func TestOrderWaitStopsWithTheContext(t *testing.T) {
	o := newOrder()
	claimOf(t, o, event(1, outbox.OpUpsert, 1))
	f := claimOf(t, o, event(2, outbox.OpUpsert, 2))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, o.wait(ctx, f), context.Canceled)
}

func TestOrderDoesNotMakeABatchWaitForItself(t *testing.T) {
	o := newOrder()
	f := claimOf(t, o, event(1, outbox.OpUpsert, 1), event(2, outbox.OpDelete, 2))
	require.Empty(t, f.after)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	require.NoError(t, o.wait(ctx, f))
}

// TestLedgerWritesOnlyEntriesAboveTheKnownOne: an applied event is written
// to the ledger only when it orders after the entry the batch knows (a
// repair of the ledger's own version from an older row does not), so a
// document's entries are written in order, which the lookup of the newest
// partition relies on (migration 00029); and never for a projection that
// keeps no ledger.
func TestLedgerWritesOnlyEntriesAboveTheKnownOne(t *testing.T) {
	l := &Loop{latest: map[string]bool{"search": true}}
	known := &outbox.Applied{Version: 5, EventID: 20}
	newer := event(21, outbox.OpUpsert, 6)
	newer.Applied = known
	sameVersionLater := event(22, outbox.OpUpsert, 5)
	sameVersionLater.Applied, sameVersionLater.Repair = known, true
	repairOfOlderRow := event(10, outbox.OpUpsert, 5)
	repairOfOlderRow.Applied, repairOfOlderRow.Repair = known, true
	first := event(30, outbox.OpUpsert, 1)
	first.EntityID = "r2"
	chronicle := event(31, outbox.OpUpsert, 1)
	chronicle.Projection = "chronicle"
	byID := map[int64]outbox.Event{}
	for _, e := range []outbox.Event{newer, sameVersionLater, repairOfOlderRow, first, chronicle} {
		byID[e.ID] = e
	}
	require.Equal(t, []int64{21, 22, 30}, l.ledgerIDs(byID, []int64{21, 22, 10, 30, 31}))
}

package consume

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/outbox"
)

// A projection whose last read found no queued row is read after the
// others for emptyRecheck, then in its turn again: an idle chronicle no
// longer costs every batch of search a round trip, and its own events wait
// at most emptyRecheck while search keeps the loop busy.
func TestEmptyProjectionIsReadLastForAWhile(t *testing.T) {
	t.Parallel()
	origin := outbox.Position{Prev: "10:10:", Cur: "10:10:"}
	l := &Loop{queues: newQueues(&origin, nil), emptyAt: map[string]time.Time{}}
	l.queues.know([]string{"chronicle", "search"})
	now := time.Now()
	require.Equal(t, []string{"chronicle", "search"}, l.readOrder(now), "in rotation order while nothing is known")

	l.emptyAt["chronicle"] = now
	require.Equal(t, []string{"search", "chronicle"}, l.readOrder(now.Add(emptyRecheck/2)), "read last while recently empty")
	require.Equal(t, []string{"chronicle", "search"}, l.readOrder(now.Add(emptyRecheck)), "in its turn again after emptyRecheck")

	l.emptyAt["search"] = now
	require.Equal(t, []string{"chronicle", "search"}, l.readOrder(now.Add(time.Millisecond)), "both empty: rotation order")
}

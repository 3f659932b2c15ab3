package replica

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/leader"
)

// The leader's other services wait for the consume loop's head start of
// their own term: not for a head start of an earlier term, and at most
// headStartAtMost.
func TestOtherServicesStartAfterTheLoopsHeadStart(t *testing.T) {
	t.Parallel()
	head := &headStart{}
	began := make(chan int64, 3)
	svc := func(epoch int64) afterHeadStart {
		return afterHeadStart{leader.ServiceFunc("probe", func(context.Context, int64, <-chan struct{}) { began <- epoch }), head}
	}
	head.open(1) // an earlier term's
	go svc(2).Run(context.Background(), 2, make(chan struct{}))
	select {
	case <-began:
		t.Fatal("started before the loop's first batch of its term")
	case <-time.After(200 * time.Millisecond):
	}
	head.open(2)
	select {
	case epoch := <-began:
		require.EqualValues(t, 2, epoch)
	case <-time.After(time.Second):
		t.Fatal("not started once the head start was over")
	}

	start := time.Now()
	go svc(3).Run(context.Background(), 3, make(chan struct{}))
	select {
	case <-began:
		require.GreaterOrEqual(t, time.Since(start), headStartAtMost)
	case <-time.After(headStartAtMost + 2*time.Second):
		t.Fatal("still waiting after headStartAtMost")
	}
}

package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The /healthz roles, as leader.Role spells them; leader's own tests use
// the harness, so it cannot import leader.
const (
	RoleLeader  = "leader"
	RoleStandby = "standby"
)

// Health is the /healthz body.
type Health struct {
	Status   string `json:"status"`
	Role     string `json:"role"`
	WorkerID string `json:"worker_id"`
	Epoch    int64  `json:"epoch"`
}

// Health reads /healthz.
func (r *Replica) Health() (Health, error) {
	var h Health
	_, body, err := r.Get("/healthz")
	if err != nil {
		return h, err
	}
	err = json.Unmarshal(body, &h)
	return h, err
}

// IsLeader reports whether /healthz says leader.
func (r *Replica) IsLeader() bool {
	h, err := r.Health()
	return err == nil && h.Role == RoleLeader
}

// WaitRole waits until /healthz says role. The elector says standby only
// once a lost leader's services have stopped writing.
func (r *Replica) WaitRole(ctx context.Context, timeout time.Duration, role string) error {
	return Poll(ctx, timeout, r.Name+" to say "+role, func(context.Context) (bool, error) {
		h, err := r.Health()
		return err == nil && h.Role == role, err
	})
}

// WaitLeader waits until exactly one live replica of rs says leader on
// /healthz, with an epoch of at least minEpoch, and returns it and its epoch.
func WaitLeader(ctx context.Context, timeout time.Duration, minEpoch int64, rs ...*Replica) (*Replica, int64, error) {
	epochs := map[*Replica]int64{}
	live := func() []*Replica {
		var out []*Replica
		for _, r := range rs {
			if r != nil && r.Alive() {
				out = append(out, r)
			}
		}
		return out
	}
	leads := func(r *Replica) bool {
		h, err := r.Health()
		if err != nil || h.Role != RoleLeader || h.Epoch < minEpoch {
			return false
		}
		epochs[r] = h.Epoch
		return true
	}
	what := fmt.Sprintf("exactly one leader with epoch >= %d", minEpoch)
	l, err := PollOne(ctx, timeout, what, live, leads)
	if err != nil {
		return nil, 0, err
	}
	return l, epochs[l], nil
}

// Leader is WaitLeader for tests, at any epoch.
func Leader(t testing.TB, rs ...*Replica) *Replica {
	t.Helper()
	l, _, err := WaitLeader(context.Background(), 15*time.Second, 0, rs...)
	require.NoError(t, err)
	return l
}

// WaitStandby waits until r is a ready standby: its lock connection, named
// lockSession (leader.LockSessionName of r's name; leader's tests use the
// harness, so it cannot import leader), waits for the advisory lock in
// pg_stat_activity of q's database. It takes over the moment the lock is
// free; /healthz says standby earlier, while it is still connecting.
func WaitStandby(ctx context.Context, timeout time.Duration, q Querier, r *Replica, lockSession string) error {
	return Poll(ctx, timeout, r.Name+" waiting for the lock", func(ctx context.Context) (bool, error) {
		if !r.Alive() {
			return false, Fatal(fmt.Errorf("replica %s exited", r.Name))
		}
		var waiting bool
		err := q.QueryRow(ctx, `
			SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			                WHERE datname = current_database() AND application_name = $1
			                  AND wait_event_type = 'Lock' AND wait_event = 'advisory')`,
			lockSession).Scan(&waiting)
		return waiting, err
	})
}

package health

import (
	"context"
	"net/http"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
)

// outbox_projections_agree is 1 while the leader's projections hash is
// unknown or this replica's, and 0 once the leader recorded another; the
// gauge poller refreshes it as /readyz does, and /readyz says the same.
// Not parallel: the gauge is the process's one series, which only a server
// with a ProjectionsHash sets.
func TestProjectionsAgreeGauge(t *testing.T) {
	db := harness.NewDatabase(t)
	f := startWith(t, db.Pool, db.URL, nil, zerolog.Nop(), Deps{ProjectionsHash: "aaaa1111", LeaderName: "wlproj"})
	ctx := context.Background()
	agree := func() float64 {
		t.Helper()
		v, ok, err := harness.ParseMetric(f.get(f.metrics, "/metrics").raw, "outbox_projections_agree")
		require.NoError(t, err)
		require.True(t, ok, "no outbox_projections_agree series")
		return v
	}

	f.srv.refreshOnce(ctx)
	require.Equal(t, 1.0, agree(), "no leader has recorded a hash: no difference")
	r := f.get(f.port, "/readyz")
	require.Equal(t, &projectionsBody{Hash: "aaaa1111", Agree: true}, r.body.Projections, r.raw)

	db.Exec(t, `INSERT INTO outbox_leader (name, holder, epoch) VALUES ('wlproj', 'w2', 1)`)
	db.Exec(t, outbox.RecordProjectionsSQL, "wlproj", 1, "bbbb2222")
	f.srv.refreshOnce(ctx)
	require.Equal(t, 0.0, agree(), "the leader runs other projections")
	r = f.get(f.port, "/readyz")
	require.Equal(t, http.StatusOK, r.code, "a difference never fails readiness: %s", r.raw)
	require.Equal(t, &projectionsBody{Hash: "aaaa1111", Leader: "bbbb2222", Agree: false}, r.body.Projections, r.raw)

	db.Exec(t, outbox.RecordProjectionsSQL, "wlproj", 1, "aaaa1111")
	f.srv.refreshOnce(ctx)
	require.Equal(t, 1.0, agree(), "the files agree again")
}

package health

import (
	"bytes"
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
)

// A pause is deliberate: /readyz lists it and stays ready, and the gauge
// says which projection is paused.
func TestReadyzListsPausedProjections(t *testing.T) {
	db := harness.NewDatabase(t)
	f := start(t, db.Pool, db.URL, nil)
	name := harness.UniqueName("p_")
	r := f.get(f.port, "/readyz")
	require.Equal(t, http.StatusOK, r.code, r.raw)
	require.Empty(t, r.body.Paused)
	require.NotContains(t, r.raw, `"paused"`)

	_, err := outbox.SetPaused(context.Background(), db.Pool, outbox.PauseRequest{Projection: name, Paused: true, By: "alice", Why: "INC-7", Known: []string{name}})
	require.NoError(t, err)
	r = f.get(f.port, "/readyz")
	require.Equal(t, http.StatusOK, r.code, "a pause does not fail readiness: %s", r.raw)
	require.Len(t, r.body.Paused, 1, r.raw)
	p := r.body.Paused[0]
	require.Equal(t, name, p.Projection)
	require.Equal(t, "alice", p.By)
	require.Equal(t, "INC-7", p.Why)
	require.WithinDuration(t, time.Now(), p.Since, time.Minute)
	require.Equal(t, 1.0, pausedValue(t, name))

	_, err = outbox.SetPaused(context.Background(), db.Pool, outbox.PauseRequest{Projection: name, Paused: false, By: "bob", Why: "fixed", Known: []string{name}})
	require.NoError(t, err)
	r = f.get(f.port, "/readyz")
	require.Empty(t, r.body.Paused, r.raw)
	require.Equal(t, 0.0, pausedValue(t, name))
}

func pausedValue(t *testing.T, projection string) float64 {
	t.Helper()
	var buf bytes.Buffer
	metrics.WritePrometheus(&buf, false)
	v, ok, err := harness.ParseMetric(buf.String(), `outbox_projection_paused{projection="`+projection+`"}`)
	require.NoError(t, err)
	require.True(t, ok, "no outbox_projection_paused series for %s", projection)
	return v
}

// A projection whose events wait (a search index not set up while its
// engine is away) is listed with why; readiness does not fail for it.
func TestReadyzListsWaitingProjections(t *testing.T) {
	db := harness.NewDatabase(t)
	var why atomic.Pointer[string]
	f := startWith(t, db.Pool, db.URL, nil, zerolog.Nop(), Deps{Waiting: func() map[string]string {
		if w := why.Load(); w != nil {
			return map[string]string{"books": *w}
		}
		return nil
	}})
	r := f.get(f.port, "/readyz")
	require.Equal(t, http.StatusOK, r.code, r.raw)
	require.NotContains(t, r.raw, `"waiting"`)

	w := "its index books is not set up yet"
	why.Store(&w)
	r = f.get(f.port, "/readyz")
	require.Equal(t, http.StatusOK, r.code, r.raw)
	require.Contains(t, r.raw, `"waiting":[{"projection":"books","why":"its index books is not set up yet"}]`)
}

package verify

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// resurrect puts b3 back in the index after the outbox deleted it: the late
// write of a deposed leader, arriving after the engine forgot the delete.
func (f fixture) resurrect(t *testing.T) {
	t.Helper()
	f.produce(t, `SELECT 'book', 'b3', 'delete', 2::bigint, '{}'::jsonb`)
	f.drain(t)
	harness.DeletesForgotten(t, f.index)
	f.es(t, http.MethodPut, "/"+f.index+"/_doc/book:b3?version=1&version_type=external_gte&refresh=true", `{"kind": "book"}`)
}

func (f fixture) service(t *testing.T, cfg ServiceConfig) *Service {
	t.Helper()
	cfg.Index = f.index
	s, err := NewService(cfg, f.Pool, f.client, f.search, zerolog.Nop())
	require.NoError(t, err)
	return s
}

func gauge(name string) float64 { return metrics.GetOrCreateGauge(name, nil).Get() }

// The gauges are process-wide: the service tests do not run in parallel
// with each other.
func TestVerifyScheduledRunDeletesAResurrection(t *testing.T) {
	f := setup(t, 100)
	f.resurrect(t)
	s := f.service(t, ServiceConfig{Interval: time.Hour, SourceTable: "search_index", AutoRepair: true})

	res, err := s.runOnce(context.Background())
	require.NoError(t, err)
	require.True(t, res.Ran)
	require.Equal(t, counts(0, 0, 0, 1), res.Report.Counts)
	require.EqualValues(t, 1, res.Repaired)
	require.Zero(t, f.verify(t, f.config("search_index")).Drift(), "the resurrected book is gone")
	require.Equal(t, 1, f.Int(t, `SELECT count(*) FROM outbox_replay_audit WHERE action = 'repair' AND replayed_by = $1
		AND event_count = 1 AND selector->'deleted' = '["book:b3"]'`, AutoBy))

	require.Zero(t, gauge(driftGauge("search", Resurrected)), "repaired: no drift left to alert on")
	require.EqualValues(t, 100, gauge(projectionGauges("search")[0]))
	require.InDelta(t, float64(time.Now().Unix()), gauge(projectionGauges("search")[1]), 60)
	runs, err := LastRuns(context.Background(), f.Pool)
	require.NoError(t, err)
	require.Len(t, runs, 1)
	// The row has no column for ahead yet: its gauge alone shows it.
	require.Equal(t, map[Kind]int64{Missing: 0, Stale: 0, Extra: 0, Resurrected: 1}, runs[0].Counts)
	require.EqualValues(t, 1, runs[0].Repaired)
	require.Equal(t, []string{"book:b3"}, runs[0].Samples[Resurrected])
	require.Equal(t, "search_index", runs[0].SourceTable)

	res, err = s.runOnce(context.Background())
	require.NoError(t, err)
	require.False(t, res.Ran, "the next run is due an interval after the last one started")
}

// Without automatic repair the run reports the resurrection and leaves it,
// and the gauge stays up for the alert; the ledger alone finds it too.
func TestVerifyScheduledRunOnlyReportsWithoutAutoRepair(t *testing.T) {
	f := setup(t, 100)
	f.resurrect(t)
	s := f.service(t, ServiceConfig{Interval: time.Hour})

	res, err := s.runOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, counts(0, 0, 0, 1), res.Report.Counts)
	require.Zero(t, res.Repaired)
	require.EqualValues(t, 1, gauge(driftGauge("search", Resurrected)))
	require.EqualValues(t, 1, f.verify(t, f.config("")).Counts[Resurrected], "still there")
	require.Zero(t, f.Int(t, `SELECT count(*) FROM outbox_replay_audit`))

	// Leadership lost: the gauges go with it.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s.Run(ctx, 1, make(chan struct{}))
	require.NotContains(t, metricsText(), "outbox_verify_drift_documents")
}

func metricsText() string {
	var b strings.Builder
	metrics.WritePrometheus(&b, false)
	return b.String()
}

func TestVerifyServiceConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg   ServiceConfig
		field string
	}{
		{ServiceConfig{Index: "x"}, "Interval"},
		{ServiceConfig{Index: "x", Interval: time.Hour, Rate: -1}, "Rate"},
		{ServiceConfig{Interval: time.Hour}, "Index"},
	} {
		_, err := NewService(tc.cfg, nil, nil, nil, zerolog.Nop())
		var field *bounds.FieldError
		require.ErrorAs(t, err, &field)
		require.Equal(t, tc.field, field.Field)
	}
}

// The automatic repair deletes through the engine itself, so it applies
// the leader's rule just before its delete: b1, judged resurrected on the
// tombstone of v2 with the index at v3, was re-created at v3 and the ack
// landed since; the ledger says live at v3 and the delete is not sent. b2,
// judged alike, has an event in flight. b3, resurrected for real, goes.
func TestVerifyAutoRepairSendsNoDeleteTheLedgerMovedPast(t *testing.T) {
	t.Parallel()
	f := setup(t, 10)
	f.produce(t, `SELECT 'book', 'b' || g, 'delete', 2::bigint, '{}'::jsonb FROM generate_series(1, 3) g`)
	f.drain(t)
	f.produce(t, `SELECT 'book', 'b1', 'upsert', 3::bigint, '{"kind": "book", "title": "again"}'::jsonb`)
	f.drain(t)
	f.produce(t, `SELECT 'book', 'b2', 'upsert', 3::bigint, '{"kind": "book", "title": "again"}'::jsonb`)
	for _, id := range []string{"b2", "b3"} {
		f.es(t, http.MethodPut, "/"+f.index+"/_doc/book:"+id+"?version=3&version_type=external_gte&refresh=true", `{"kind": "book"}`)
	}
	judged := func(id string) Drift {
		return Drift{Kind: Resurrected, ID: "book:" + id, EntityType: "book", EntityID: id, IndexVersion: 3,
			Ledger: &Entry{Version: 2, Deleted: true}}
	}
	s := f.service(t, ServiceConfig{Interval: time.Hour, AutoRepair: true})

	deleted, err := s.deleteResurrected(context.Background(), []Drift{judged("b1"), judged("b2"), judged("b3")})
	require.NoError(t, err)
	require.Equal(t, []string{"book:b3"}, deleted)
	f.es(t, http.MethodPost, "/"+f.index+"/_refresh", "")
	require.Equal(t, counts(0, 0, 0, 0), f.verify(t, f.config("")).Counts, "b1 live at v3, b2 waits for its event, b3 gone")
	require.Equal(t, 1, f.Count(t, `entity_id = 'b2' AND status = 'pending'`))
}

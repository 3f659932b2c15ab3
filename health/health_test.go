package health

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/leader"
)

type fixture struct {
	t        *testing.T
	srv      *Server
	elector  *leader.Elector
	draining *atomic.Bool
	esErr    atomic.Pointer[error]
	port     int
	metrics  int
}

// start serves a health server for a replica named w1 on the given pool;
// change adjusts its config.
func start(t *testing.T, pool *pgxpool.Pool, dbURL string, change func(*Config)) *fixture {
	return startLogging(t, pool, dbURL, change, zerolog.Nop())
}

// startLogging is start with the server logging to log.
func startLogging(t *testing.T, pool *pgxpool.Pool, dbURL string, change func(*Config), log zerolog.Logger) *fixture {
	return startWith(t, pool, dbURL, change, log, Deps{})
}

// startWith is startLogging with more of the server's Deps: those the
// fixture does not fill itself.
func startWith(t *testing.T, pool *pgxpool.Pool, dbURL string, change func(*Config), log zerolog.Logger, deps Deps) *fixture {
	f := &fixture{t: t, draining: &atomic.Bool{}, port: harness.Port(t)}
	var err error
	f.elector, err = leader.New(leader.Config{DatabaseURL: dbURL, WorkerID: "w1", Name: harness.UniqueName("health_")},
		zerolog.Nop(), leader.ServiceFunc("idle", func(ctx context.Context, _ int64, drain <-chan struct{}) {
			select {
			case <-ctx.Done():
			case <-drain:
			}
		}))
	require.NoError(t, err)
	cfg := Config{HTTPPort: f.port}
	if change != nil {
		change(&cfg)
	}
	f.metrics = cmpOr(cfg.MetricsPort, f.port)
	deps.Pool, deps.Elector, deps.Draining, deps.Log = pool, f.elector, f.draining, log
	deps.PingES = func(context.Context) error {
		if e := f.esErr.Load(); e != nil {
			return *e
		}
		return nil
	}
	f.srv, err = New(cfg, deps)
	require.NoError(t, err)
	require.NoError(t, f.srv.Start(context.Background()))
	t.Cleanup(f.srv.Stop)
	return f
}

func cmpOr(a, b int) int {
	if a != 0 {
		return a
	}
	return b
}

type reply struct {
	code int
	body body
	raw  string
}

func (f *fixture) get(port int, path string) reply {
	resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(port) + path)
	require.NoError(f.t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(f.t, err)
	r := reply{code: resp.StatusCode, raw: string(raw)}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		require.NoError(f.t, json.Unmarshal(raw, &r.body), string(raw))
	}
	return r
}

// unreachablePool points at a port nothing listens on; pgxpool connects lazily.
func unreachablePool(t *testing.T) (*pgxpool.Pool, string) {
	u := "postgres://nobody@127.0.0.1:" + strconv.Itoa(harness.Port(t)) + "/none?connect_timeout=1"
	pool, err := pgxpool.New(context.Background(), u)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, u
}

func TestHealthzFailsWhenTheLoopStopsTicking(t *testing.T) {
	pool, u := unreachablePool(t)
	f := start(t, pool, u, func(c *Config) { c.StaleAfter = 300 * time.Millisecond })

	r := f.get(f.port, "/healthz")
	require.Equal(t, http.StatusOK, r.code, r.raw)
	require.Equal(t, "ok", r.body.Checks["loop"])
	// Liveness does not depend on the database: a standby cut off from it
	// must not be restarted for that.
	require.Equal(t, leader.RoleStandby, r.body.Role)
	require.Equal(t, "w1", r.body.WorkerID)
	require.Zero(t, r.body.Epoch)

	time.Sleep(400 * time.Millisecond) // nothing runs the elector: no tick
	r = f.get(f.port, "/healthz")
	require.Equal(t, http.StatusServiceUnavailable, r.code, r.raw)
	require.Equal(t, "fail", r.body.Status)
	require.Contains(t, r.body.Checks["loop"], "last tick")
}

func TestReadyzNamesTheFailedCheck(t *testing.T) {
	db := harness.NewDatabase(t)
	f := start(t, db.Pool, db.URL, nil)

	r := f.get(f.port, "/readyz")
	require.Equal(t, http.StatusOK, r.code, r.raw)
	require.Equal(t, map[string]string{"draining": "no", "database": "ok", "schema": "ok"}, r.body.Checks,
		"without the gate the engine is not part of readiness")

	down := error(errors.New("connection refused"))
	f.esErr.Store(&down)
	r = f.get(f.port, "/readyz")
	require.Equal(t, http.StatusOK, r.code, "engine down, gate off: still ready: %s", r.raw)

	f.draining.Store(true)
	r = f.get(f.port, "/readyz")
	require.Equal(t, http.StatusServiceUnavailable, r.code, r.raw)
	require.Equal(t, "shutting down", r.body.Checks["draining"])
	require.Equal(t, "ok", r.body.Checks["database"])
}

func TestReadyzEngineGate(t *testing.T) {
	db := harness.NewDatabase(t)
	f := start(t, db.Pool, db.URL, func(c *Config) { c.RequireES = true })

	r := f.get(f.port, "/readyz")
	require.Equal(t, http.StatusOK, r.code, r.raw)
	require.Equal(t, "ok", r.body.Checks["elasticsearch"])

	down := error(errors.New("dial tcp 127.0.0.1:9200: connection refused"))
	f.esErr.Store(&down)
	r = f.get(f.port, "/readyz")
	require.Equal(t, http.StatusServiceUnavailable, r.code, r.raw)
	require.Equal(t, "unreachable: dial tcp 127.0.0.1:9200: connection refused", r.body.Checks["elasticsearch"])
	require.Equal(t, "ok", r.body.Checks["database"])

	f.esErr.Store(nil)
	require.Equal(t, http.StatusOK, f.get(f.port, "/readyz").code)
}

func TestReadyzFailsWithoutTheDatabase(t *testing.T) {
	pool, u := unreachablePool(t)
	f := start(t, pool, u, nil)
	r := f.get(f.port, "/readyz")
	require.Equal(t, http.StatusServiceUnavailable, r.code, r.raw)
	require.True(t, strings.HasPrefix(r.body.Checks["database"], "unreachable: "), r.raw)
	require.NotContains(t, r.raw, "nobody@", "no credentials in the body")
}

func TestBodyCarriesTheLeadersEpoch(t *testing.T) {
	db := harness.NewDatabase(t)
	f := start(t, db.Pool, db.URL, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.elector.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	harness.Eventually(t, 10*time.Second, "the replica leads", func() bool {
		return f.get(f.port, "/healthz").body.Role == leader.RoleLeader
	})
	r := f.get(f.port, "/readyz")
	require.Equal(t, http.StatusOK, r.code, r.raw)
	require.Equal(t, leader.RoleLeader, r.body.Role)
	require.Equal(t, "w1", r.body.WorkerID)
	require.Equal(t, int64(1), r.body.Epoch)
}

func TestMetricsAndPprofListeners(t *testing.T) {
	pool, u := unreachablePool(t)
	metricsPort := harness.Port(t)
	f := start(t, pool, u, func(c *Config) { c.MetricsPort = metricsPort })

	require.Equal(t, http.StatusOK, f.get(metricsPort, "/metrics").code)
	require.Contains(t, f.get(metricsPort, "/metrics").raw, "outbox_lag_events")
	require.Equal(t, http.StatusNotFound, f.get(f.port, "/metrics").code, "metrics only on their own port")
	require.Equal(t, http.StatusNotFound, f.get(metricsPort, "/healthz").code)
	require.Equal(t, http.StatusNotFound, f.get(metricsPort, "/debug/pprof/").code, "pprof is off by default")

	g := start(t, pool, u, func(c *Config) { c.Pprof = true })
	require.Equal(t, http.StatusOK, g.get(g.port, "/debug/pprof/").code)
	require.Equal(t, http.StatusOK, g.get(g.port, "/metrics").code, "one listener serves everything")
}

func TestNewRefusesPortsOutOfRange(t *testing.T) {
	// The HTTP port first, every time: the metrics port defaults to it.
	for range 20 {
		_, err := New(Config{HTTPPort: 70000}, Deps{})
		require.EqualError(t, err, "HTTPPort=70000 is out of range [1, 65535]")
	}
	_, err := New(Config{HTTPPort: 8080, MetricsPort: -1}, Deps{})
	require.EqualError(t, err, "MetricsPort=-1 is out of range [0, 65535]")
}

// Validate checks the ports as given, before any default: a zero HTTP port
// is refused, a zero metrics port means the HTTP port.
func TestConfigValidate(t *testing.T) {
	t.Parallel()
	require.NoError(t, Config{HTTPPort: 8080}.Validate())
	require.EqualError(t, Config{}.Validate(), "HTTPPort=0 is out of range [1, 65535]")
	require.EqualError(t, Config{HTTPPort: 8080, MetricsPort: 70000}.Validate(), "MetricsPort=70000 is out of range [0, 65535]")
	require.Equal(t, 8080, Config{HTTPPort: 8080}.withDefaults().MetricsPort)
}

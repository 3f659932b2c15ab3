package health

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/pprof"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/wlproj/wlproj/classify"
	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/internal/httpserve"
	"github.com/wlproj/wlproj/internal/metrichelp"
	"github.com/wlproj/wlproj/internal/startstop"
	"github.com/wlproj/wlproj/leader"
	"github.com/wlproj/wlproj/outbox"
)

// Defaults of Config. The CLI's flags take theirs from here.
const (
	AddrDefault     = "127.0.0.1"
	HTTPPortDefault = 8080
)

// PortRange is what HTTPPort and MetricsPort accept.
var PortRange = bounds.Range[int]{Min: 1, Max: 65535}

const (
	staleAfterDefault           = 10 * time.Second
	checkTimeoutDefault         = 2 * time.Second
	gaugeIntervalDefault        = 5 * time.Second
	standbyGaugeIntervalDefault = 30 * time.Second
)

// Config configures the health server.
type Config struct {
	// Addr is the bind address. Defaults to 127.0.0.1.
	Addr string
	// HTTPPort serves /healthz and /readyz. Required.
	HTTPPort int
	// MetricsPort serves /metrics; the same port as HTTPPort, or 0, serves
	// everything on one listener. Defaults to HTTPPort.
	MetricsPort int
	// RequireES makes the engine part of readiness. Defaults to false.
	RequireES bool
	// StaleAfter is how old the last loop tick may be before /healthz fails.
	// Defaults to 10s.
	StaleAfter time.Duration
	// CheckTimeout bounds each readiness probe. Defaults to 2s.
	CheckTimeout time.Duration
	// GaugeInterval is how often the leader refreshes the outbox gauges.
	// Defaults to 5s.
	GaugeInterval time.Duration
	// StandbyGaugeInterval is the same on a standby. Defaults to 30s.
	StandbyGaugeInterval time.Duration
	// MaxProcessing is the stuck cap used for outbox_stuck_processing_events.
	// Defaults to 300s.
	MaxProcessing time.Duration
	// Pprof serves Go's /debug/pprof/ next to /metrics, for
	// profiling a live leader. Defaults to false.
	Pprof bool
	// SchemaInterval is how often the replica reads the schema version,
	// which readiness and the elector's CanLead compare with the version
	// this binary needs. Defaults to 5s.
	SchemaInterval time.Duration
}

// Deps is what the server observes.
type Deps struct {
	Pool     *pgxpool.Pool
	Elector  *leader.Elector
	PingES   func(ctx context.Context) error
	Draining *atomic.Bool
	Log      zerolog.Logger
	// Projections are the projections the binary knows: each gets an
	// outbox_projection_paused series, at 0 until paused.
	Projections []string
	// Routes are more handlers on the HTTP listener, by ServeMux pattern:
	// the operator console's /console/ when it has no port of its own.
	Routes map[string]http.Handler
	// ProjectionsHash identifies the projections this replica runs, and
	// LeaderName the leader record whose hash /readyz and the
	// outbox_projections_agree gauge compare it with; without it, neither
	// does.
	ProjectionsHash, LeaderName string
	// Horizon reads the database's vacuum horizon for its gauges and
	// remembers since when it has seen each holder; the replica shares it
	// with the console, so both give the same age. Defaults to a watch of
	// the server's own.
	Horizon *outbox.HorizonWatch
	// Gates are more readiness checks, by name: each says why this
	// replica may not lead, "" when it may (the replica's queue_home).
	Gates map[string]func() string
	// Waiting says, for each projection whose events wait, why; nil or
	// empty when none does.
	Waiting func() map[string]string
}

// Server is the replica's HTTP surface, a startstop.Service.
type Server struct {
	cfg     Config
	deps    Deps
	servers []*httpserve.Server
	ready   *metrics.Gauge
	// agree is outbox_projections_agree; nil without a ProjectionsHash.
	agree   *metrics.Gauge
	gauges  struct{ lag, oldest, inflight, stuck *metrics.Gauge }
	horizon *horizonGauges
	// schema holds the database's schema version against this binary's.
	schema *schemaCheck
	// refresher keeps the gauges fresh between Start and Stop.
	refresher startstop.Runner
}

func init() {
	metrichelp.Describe(map[string]string{
		"outbox_projection_paused": "1 while an operator has paused the projection (wlproj pause), else 0.",
		"outbox_projections_agree": "0 while the leader recorded another projections hash than this replica's, else 1 (also while the leader's is unknown).",
	})
}

func pausedGauge(projection string) *metrics.Gauge {
	return metrics.GetOrCreateGauge(fmt.Sprintf(`outbox_projection_paused{projection=%q}`, projection), nil)
}

func (c Config) withDefaults() Config {
	c.Addr = cmp.Or(c.Addr, AddrDefault)
	c.MetricsPort = cmp.Or(c.MetricsPort, c.HTTPPort)
	c.StaleAfter = cmp.Or(c.StaleAfter, staleAfterDefault)
	c.CheckTimeout = cmp.Or(c.CheckTimeout, checkTimeoutDefault)
	c.GaugeInterval = cmp.Or(c.GaugeInterval, gaugeIntervalDefault)
	c.StandbyGaugeInterval = cmp.Or(c.StandbyGaugeInterval, standbyGaugeIntervalDefault)
	c.MaxProcessing = cmp.Or(c.MaxProcessing, outbox.MaxProcessingDefault)
	c.SchemaInterval = cmp.Or(c.SchemaInterval, schemaIntervalDefault)
	return c
}

// Validate checks the ports as given; a range error is a
// *bounds.FieldError. A MetricsPort of 0 means the HTTP port.
func (c Config) Validate() error {
	return bounds.First(
		bounds.Check("HTTPPort", c.HTTPPort, PortRange),
		bounds.Check("MetricsPort", c.MetricsPort, bounds.Range[int]{Min: 0, Max: PortRange.Max}),
	)
}

// New validates cfg and binds the listeners, so a port conflict fails fast.
func New(cfg Config, deps Deps) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Server{cfg: cfg, deps: deps, horizon: newHorizonGauges()}
	if s.deps.Horizon == nil {
		s.deps.Horizon = &outbox.HorizonWatch{}
	}
	s.schema = newSchemaCheck(deps.Pool, cfg.SchemaInterval, cfg.CheckTimeout, deps.Log)
	s.ready = metrics.GetOrCreateGauge(`outbox_ready`, nil)
	s.gauges.lag = metrics.GetOrCreateGauge(`outbox_lag_events`, nil)
	s.gauges.oldest = metrics.GetOrCreateGauge(`outbox_oldest_age_seconds`, nil)
	s.gauges.inflight = metrics.GetOrCreateGauge(`outbox_inflight_events`, nil)
	s.gauges.stuck = metrics.GetOrCreateGauge(`outbox_stuck_processing_events`, nil)
	for _, p := range deps.Projections {
		pausedGauge(p)
	}
	if deps.ProjectionsHash != "" {
		// Agreeing until read: an unknown leader hash is no difference.
		s.agree = metrics.GetOrCreateGauge(`outbox_projections_agree`, nil)
		s.agree.Set(1)
	}

	api := http.NewServeMux()
	api.HandleFunc("/healthz", s.healthz)
	api.HandleFunc("/readyz", s.readyz)
	for pattern, h := range deps.Routes {
		api.Handle(pattern, h)
	}
	if cfg.MetricsPort == cfg.HTTPPort {
		s.serveMetrics(api)
		return s, s.listen(api, cfg.HTTPPort)
	}
	m := http.NewServeMux()
	s.serveMetrics(m)
	if err := s.listen(api, cfg.HTTPPort); err != nil {
		return nil, err
	}
	if err := s.listen(m, cfg.MetricsPort); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// serveMetrics adds /metrics to m, and Go's /debug/pprof/ with Pprof.
func (s *Server) serveMetrics(m *http.ServeMux) {
	m.HandleFunc("/metrics", serveMetrics)
	if !s.cfg.Pprof {
		return
	}
	m.HandleFunc("/debug/pprof/", pprof.Index)
	m.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	m.HandleFunc("/debug/pprof/profile", pprof.Profile)
	m.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	m.HandleFunc("/debug/pprof/trace", pprof.Trace)
}

func (s *Server) listen(h http.Handler, port int) error {
	srv, err := httpserve.Listen(s.cfg.Addr, port, &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}, nil)
	if err != nil {
		return err
	}
	s.servers = append(s.servers, srv)
	return nil
}

// Start serves the listeners and keeps the outbox gauges and the schema
// version fresh until Stop or ctx ends.
func (s *Server) Start(ctx context.Context) error {
	for _, srv := range s.servers {
		if err := srv.Start(ctx); err != nil {
			return err
		}
	}
	s.refresher.Run(ctx, s.refreshGauges)
	return s.schema.Start(ctx)
}

// Stop stops the gauges, the schema reads and the listeners, letting
// requests in flight finish for a second.
func (s *Server) Stop() {
	s.schema.Stop()
	s.refresher.Stop()
	for _, srv := range s.servers {
		srv.Stop()
	}
}

type body struct {
	Status   string            `json:"status"`
	Role     leader.Role       `json:"role"`
	WorkerID string            `json:"worker_id"`
	Epoch    int64             `json:"epoch"`
	Checks   map[string]string `json:"checks,omitempty"`
	// Paused lists the paused projections on /readyz. A pause is deliberate,
	// so it never fails readiness; their lag grows and shows here.
	Paused []pausedBody `json:"paused,omitempty"`
	// Waiting lists the projections whose events wait for something of
	// theirs (a search index not set up while its engine is away), and
	// why, on /readyz. It does not fail readiness by itself (the engine
	// check does, under RequireES): the other projections go on meanwhile.
	Waiting []waitingBody `json:"waiting,omitempty"`
	// Schema is the database's schema version against this binary's, on
	// /readyz.
	Schema *SchemaStatus `json:"schema,omitempty"`
	// Projections compares this replica's projections with the leader's,
	// on /readyz. A difference never fails readiness: it is what a rolling
	// restart that changes the projections file goes through.
	Projections *projectionsBody `json:"projections,omitempty"`
}

type projectionsBody struct {
	Hash string `json:"hash"`
	// Leader is the leader's, "" when no leader recorded one (a binary
	// before schema 22).
	Leader string `json:"leader"`
	// Agree is false when both are known and differ.
	Agree bool `json:"agree"`
}

// SchemaOK reports whether the database's schema is at least the version
// this binary needs, as last read; false before the first read. The
// elector campaigns only while it holds (leader.Elector.CanLead).
func (s *Server) SchemaOK() bool { return s.schema.OK() }

type waitingBody struct {
	Projection string `json:"projection"`
	Why        string `json:"why"`
}

type pausedBody struct {
	Projection string    `json:"projection"`
	By         string    `json:"by"`
	Why        string    `json:"why"`
	Since      time.Time `json:"since"`
}

// write sends b, with the status and the elector's state filled in.
func (s *Server) write(w http.ResponseWriter, ok bool, b body) {
	st := s.deps.Elector.State()
	b.Status, b.Role, b.WorkerID, b.Epoch = "ok", st.Role, st.WorkerID, st.Epoch
	code := http.StatusOK
	if !ok {
		b.Status, code = "fail", http.StatusServiceUnavailable
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(b)
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	age := time.Since(s.deps.Elector.LastTick())
	ok := age <= s.cfg.StaleAfter
	checks := map[string]string{"loop": "ok"}
	if !ok {
		checks["loop"] = "last tick " + age.Round(time.Millisecond).String() + " ago"
	}
	s.write(w, ok, body{Checks: checks})
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.CheckTimeout)
	defer cancel()
	checks, ok := s.readiness(ctx)
	if ok {
		s.ready.Set(1)
	} else {
		s.ready.Set(0)
	}
	b := body{Checks: checks, Waiting: s.waiting()}
	// Before the migration these tables may not exist: the schema check is
	// then the reason, logged once, not a warning per probe.
	if checks["database"] == "ok" && checks["schema"] == "ok" {
		b.Paused = s.paused(ctx)
		b.Projections = s.projections(ctx)
	}
	schema := s.schema.current(ctx)
	b.Schema = &schema
	s.write(w, ok, b)
}

// waiting lists the projections whose events wait, by name.
func (s *Server) waiting() []waitingBody {
	if s.deps.Waiting == nil {
		return nil
	}
	var out []waitingBody
	for name, why := range s.deps.Waiting() {
		out = append(out, waitingBody{Projection: name, Why: why})
	}
	slices.SortFunc(out, func(a, b waitingBody) int { return strings.Compare(a.Projection, b.Projection) })
	return out
}

// projections reads the leader's projections hash next to this replica's
// and refreshes outbox_projections_agree; nil when it cannot be read (the
// database check covers reachability), which leaves the gauge as it was.
func (s *Server) projections(ctx context.Context) *projectionsBody {
	if s.deps.ProjectionsHash == "" {
		return nil
	}
	a, err := outbox.CompareProjections(ctx, s.deps.Pool, s.deps.LeaderName, s.deps.ProjectionsHash)
	if err != nil {
		if ctx.Err() == nil {
			s.deps.Log.Warn().Err(err).Msg("read the leader's projections hash")
		}
		return nil
	}
	if a.Agree() {
		s.agree.Set(1)
	} else {
		s.agree.Set(0)
	}
	return &projectionsBody{Hash: a.Hash, Leader: a.Leader, Agree: a.Agree()}
}

// paused reads the paused projections and refreshes their gauges. A failed
// read leaves them out: the database check already covers reachability.
func (s *Server) paused(ctx context.Context) []pausedBody {
	states, err := outbox.ProjectionStates(ctx, s.deps.Pool)
	if err != nil {
		if ctx.Err() == nil {
			s.deps.Log.Warn().Err(err).Msg("read projection states")
		}
		return nil
	}
	var paused []pausedBody
	for _, st := range states {
		v := 0.0
		if st.Paused {
			v = 1
			paused = append(paused, pausedBody{Projection: st.Projection, By: st.ChangedBy, Why: st.Why, Since: st.ChangedAt.UTC()})
		}
		pausedGauge(st.Projection).Set(v)
	}
	return paused
}

func (s *Server) readiness(ctx context.Context) (map[string]string, bool) {
	checks := map[string]string{}
	ok := true
	fail := func(name, why string) { checks[name], ok = why, false }
	if s.deps.Draining.Load() {
		fail("draining", "shutting down")
	} else {
		checks["draining"] = "no"
	}
	if err := s.deps.Pool.Ping(ctx); err != nil {
		fail("database", "unreachable: "+errText(err))
	} else {
		checks["database"] = "ok"
	}
	// A replica on a schema older than its binary needs would claim with
	// statements that fail, or walk an index that is not there.
	if schema := s.schema.current(ctx); schema.OK() {
		checks["schema"] = "ok"
	} else {
		fail("schema", schema.check(s.cfg.SchemaInterval))
	}
	for name, problem := range s.deps.Gates {
		if why := problem(); why != "" {
			fail(name, why)
		} else {
			checks[name] = "ok"
		}
	}
	if s.cfg.RequireES {
		if err := s.deps.PingES(ctx); err != nil {
			fail("elasticsearch", engineText(err))
		} else {
			checks["elasticsearch"] = "ok"
		}
	}
	return checks, ok
}

// engineText says why the engine check failed: "unreachable" unless the
// engine answered, e.g. with a 401 for wrong credentials. The error names
// the engine and its reason (see projection.EngineProbe.Ping).
func engineText(err error) string {
	var ce *classify.Error
	if errors.As(err, &ce) && ce.Status != 0 {
		return "answered " + strconv.Itoa(ce.Status) + ": " + errText(err)
	}
	return "unreachable: " + errText(err)
}

// errText keeps probe errors short; pgx and net errors name host and port
// but never the password.
func errText(err error) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return "timed out"
	}
	msg := err.Error()
	if len(msg) > 200 {
		msg = msg[:200]
	}
	return msg
}

func (s *Server) refreshGauges(ctx context.Context) {
	// Wake at the leader's pace whatever the role, so a standby that is
	// promoted reports fresh gauges within one leader interval.
	var last time.Time
	for {
		if s.deps.Elector.State().Role == leader.RoleLeader || time.Since(last) >= s.cfg.StandbyGaugeInterval {
			s.refreshOnce(ctx)
			last = time.Now()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(s.cfg.GaugeInterval):
		}
	}
}

func (s *Server) refreshOnce(ctx context.Context) {
	qctx, cancel := context.WithTimeout(ctx, s.cfg.CheckTimeout)
	defer cancel()
	if _, ok := s.readiness(qctx); ok {
		s.ready.Set(1)
	} else {
		s.ready.Set(0)
	}
	if !s.schema.OK() {
		return // the tables read below may not exist yet; the schema check says so
	}
	snap, err := outbox.ReadGauges(qctx, s.deps.Pool, s.cfg.MaxProcessing)
	if err != nil {
		if ctx.Err() == nil {
			s.deps.Log.Warn().Err(err).Msg("refresh outbox gauges")
		}
		return
	}
	s.gauges.lag.Set(float64(snap.Lag))
	s.gauges.oldest.Set(snap.OldestPendingAge.Seconds())
	s.gauges.inflight.Set(float64(snap.InFlight))
	s.gauges.stuck.Set(float64(snap.Stuck))
	s.paused(qctx)
	s.projections(qctx)
	h, err := s.deps.Horizon.Read(qctx, s.deps.Pool)
	if err != nil {
		if ctx.Err() == nil {
			s.deps.Log.Warn().Err(err).Msg("refresh horizon gauges")
		}
		return
	}
	s.horizon.set(h)
}

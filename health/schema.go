package health

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/rs/zerolog"

	"github.com/wlproj/wlproj/internal/metrichelp"
	"github.com/wlproj/wlproj/internal/startstop"
	"github.com/wlproj/wlproj/migrations"
)

// schemaIntervalDefault is how often a replica reads the schema version:
// after wlproj migrate, a replica that waited for it is ready, and
// campaigns, within about this long.
const schemaIntervalDefault = 5 * time.Second

// schemaFreshFor is how old a reading the elector's verdict may come from,
// and schemaFreshTimeout how long the elector waits for a new one.
const (
	schemaFreshFor     = time.Second
	schemaFreshTimeout = 500 * time.Millisecond
)

// insufficientPrivilege is the SQLSTATE of a role missing a grant.
const insufficientPrivilege = "42501"

func init() {
	metrichelp.Describe(map[string]string{
		"outbox_schema_version":          "Schema version (newest applied migration) this replica last read from goose_db_version; 0 until a read succeeds.",
		"outbox_schema_required_version": "Oldest schema version this binary runs on; below it the replica neither leads nor reports ready.",
	})
	metrics.NewGauge(`outbox_schema_required_version`, func() float64 { return float64(migrations.RequiredVersion) })
}

var schemaVersionGauge = metrics.NewGauge(`outbox_schema_version`, nil)

// SchemaStatus is the schema part of /readyz: the database's version
// against what this binary needs and carries.
type SchemaStatus struct {
	// Database names the database, as wlproj migrate --expect-db wants it.
	Database string `json:"database,omitempty"`
	// Version is the newest migration applied, as last read.
	Version int64 `json:"version"`
	// Required is the oldest version this binary runs on.
	Required int64 `json:"required"`
	// Newest is the newest migration this binary carries; a database past
	// it is fine (migrations only add).
	Newest int64 `json:"newest"`
	// Error says why the last read failed; the version is then the one
	// read before, if any.
	Error string `json:"error,omitempty"`
	// Read reports that a read has succeeded.
	Read bool `json:"read"`
}

// OK reports whether the schema is known to be new enough.
func (s SchemaStatus) OK() bool { return s.Read && s.Version >= s.Required }

// check is the value of the "schema" readiness check.
func (s SchemaStatus) check(interval time.Duration) string {
	switch {
	case s.OK():
		return "ok"
	case !s.Read && s.Error != "":
		return "cannot read the schema version: " + s.Error
	case !s.Read:
		return "not read yet"
	}
	return fmt.Sprintf("database %s is at schema version %d, this binary needs %d or newer: "+
		"run wlproj migrate --expect-db %s with the owner's DATABASE_URL; this replica is ready and may lead within %s after",
		s.Database, s.Version, s.Required, s.Database, interval)
}

// schemaCheck reads the schema version on a schedule and keeps the verdict
// for readiness and the elector, which ask every tick: both read the kept
// status, never the database. A failed read keeps the last verdict, so a
// blip does not move leadership; before any read succeeds the verdict is
// no.
type schemaCheck struct {
	db       migrations.Querier
	required int64
	interval time.Duration
	timeout  time.Duration
	log      zerolog.Logger

	mu     sync.Mutex // one read at a time
	status atomic.Pointer[SchemaStatus]
	readAt atomic.Int64 // unix nanoseconds of the last read's end, failed or not
	runner startstop.Runner
}

func newSchemaCheck(db migrations.Querier, interval, timeout time.Duration, log zerolog.Logger) *schemaCheck {
	return &schemaCheck{db: db, required: migrations.RequiredVersion, interval: interval, timeout: timeout,
		log: log.With().Str("service", "schema").Logger()}
}

// OK is the elector's verdict: the kept one, read again first when it is
// older than schemaFreshFor. A standby about to lead must not lead on a
// reading from before a rollback began (one took over 5 s late on a
// schema its claim refused); the elector asks between its one-second lock
// slices and at every tick of a term, so this reads goose_db_version (one
// row per migration, sub-millisecond) about once a second, in at most
// schemaFreshTimeout; a failed read keeps the last verdict, as the
// schedule's does.
func (c *schemaCheck) OK() bool {
	if time.Since(time.Unix(0, c.readAt.Load())) > schemaFreshFor {
		ctx, cancel := context.WithTimeout(context.Background(), min(c.timeout, schemaFreshTimeout))
		c.read(ctx)
		cancel()
	}
	st := c.status.Load()
	return st != nil && st.OK()
}

// current is the kept status, read now if nothing was ever tried, so the
// first /readyz of a replica says what it found rather than "not read yet".
func (c *schemaCheck) current(ctx context.Context) SchemaStatus {
	if st := c.status.Load(); st != nil {
		return *st
	}
	return c.read(ctx)
}

// Start reads the version now and every interval until Stop or ctx ends,
// but at least every half schemaFreshFor: the elector asks for a verdict
// no older than schemaFreshFor the moment it wins the lock, and a reading
// kept fresh in the background spares the takeover that round trip (a
// synchronous read there cost a standby up to tens of milliseconds under
// load). One primary-key read of goose_db_version twice a second.
func (c *schemaCheck) Start(ctx context.Context) error {
	c.runner.Run(ctx, func(ctx context.Context) {
		ticker := time.NewTicker(min(c.interval, schemaFreshFor/2))
		defer ticker.Stop()
		for {
			rctx, cancel := context.WithTimeout(ctx, c.timeout)
			c.read(rctx)
			cancel()
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
			}
		}
	})
	return nil
}

// Stop ends the schedule.
func (c *schemaCheck) Stop() { c.runner.Stop() }

// read reads the version, keeps the new status, and logs it if the verdict
// changed. A read cut short by the replica's shutdown changes nothing.
func (c *schemaCheck) read(ctx context.Context) SchemaStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	var prev SchemaStatus
	if p := c.status.Load(); p != nil {
		prev = *p
	}
	next := prev
	next.Required, next.Newest = c.required, migrations.HeadVersion()
	s, err := migrations.SchemaVersion(ctx, c.db)
	switch {
	case err != nil && errors.Is(ctx.Err(), context.Canceled):
		return prev
	case err != nil:
		next.Error = schemaErrText(err)
	default:
		next.Database, next.Version, next.Error, next.Read = s.Database, s.Version, "", true
		schemaVersionGauge.Set(float64(s.Version))
	}
	c.status.Store(&next)
	c.readAt.Store(time.Now().UnixNano())
	c.logChange(prev, next)
	return next
}

// schemaErrText says why the version could not be read, with the fix for
// the one cause an operator meets on upgrade: a runtime role that predates
// the grant.
func schemaErrText(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == insufficientPrivilege {
		return errText(err) + "; the runtime role needs SELECT on goose_db_version: apply roles.sql again (runbook: Least privilege)"
	}
	return errText(err)
}

// logChange logs a status once when its verdict, version or failing read
// changes, not on every read.
func (c *schemaCheck) logChange(prev, next SchemaStatus) {
	changed := prev.OK() != next.OK() || prev.Version != next.Version || (prev.Error == "") != (next.Error == "")
	if !changed && prev.Required != 0 {
		return
	}
	ev := c.log.Info()
	switch {
	case next.Error != "":
		ev = c.log.Warn().Str("error", next.Error)
	case !next.OK():
		ev = c.log.Error()
	}
	ev = ev.Str("database", next.Database).Int64("schema_version", next.Version).Int64("required_version", next.Required).
		Int64("newest_known_version", next.Newest).Bool("schema_ok", next.OK())
	switch {
	case next.Error != "":
		ev.Msg("cannot read the schema version; keeping the last verdict")
	case !next.OK():
		ev.Str("fix", "wlproj migrate --expect-db "+next.Database).
			Msg("schema older than this binary needs: not ready, not campaigning for leadership until it is migrated")
	case next.Version > next.Newest:
		ev.Msg("schema newer than this binary: fine, migrations only add")
	default:
		ev.Msg("schema version ok")
	}
}

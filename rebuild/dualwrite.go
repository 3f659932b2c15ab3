package rebuild

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/wlproj/wlproj/leader"
	"github.com/wlproj/wlproj/projection"
)

const (
	// CacheTTL bounds how old a replica's view of the open rebuild may be
	// when its handler uses it. Run waits twice this after opening, besides
	// the leader's confirmation, so that no replica still acts on a view
	// from before the rebuild opened.
	CacheTTL = 250 * time.Millisecond
	// refreshEvery keeps the leader's view fresh, so the handler almost
	// never waits for the query, and confirms a new rebuild quickly.
	refreshEvery = 100 * time.Millisecond
)

// DualWrite is the leader's side of a rebuild. It tells the search handler
// the open rebuild's index (projection.RebuildTarget) from a cache at most
// CacheTTL old, so there is no query per event; and as a leader service it
// refreshes that cache and records in the rebuild row that this leader
// writes to both indexes, which is what Run waits for before it snapshots
// the source table.
type DualWrite struct {
	leader.Periodic
	pool       *pgxpool.Pool
	projection string
	index      string
	owner      string
	log        zerolog.Logger

	mu       sync.Mutex
	cur      openView
	loadedAt time.Time
	warned   int64
	warnedAt time.Time
}

// openView is what the handler needs of the open rebuild.
type openView struct {
	id     int64
	target string
	epoch  int64 // the last leader epoch that confirmed it
}

var _ projection.RebuildTarget = (*DualWrite)(nil)

// NewDualWrite makes search write to the open rebuild of projectionName
// (one whose alias is search's index) and returns the service that keeps
// that view fresh; owner is this replica's worker id, recorded with the
// confirmation.
func NewDualWrite(pool *pgxpool.Pool, projectionName string, search *projection.Search, owner string, log zerolog.Logger) *DualWrite {
	d := &DualWrite{pool: pool, projection: projectionName, index: search.Index(), owner: owner,
		log: log.With().Str("service", "rebuild-dual-write").Logger()}
	d.Periodic = leader.Periodic{ServiceName: "rebuild-dual-write", Interval: refreshEvery, Log: log, Once: d.runOnce}
	search.DualWriteTo(d)
	return d
}

// RebuildIndex implements projection.RebuildTarget.
func (d *DualWrite) RebuildIndex(ctx context.Context) (string, error) {
	d.mu.Lock()
	cur, fresh := d.cur, time.Since(d.loadedAt) < CacheTTL
	d.mu.Unlock()
	if fresh {
		return cur.target, nil
	}
	v, err := d.load(ctx)
	return v.target, err
}

const openViewSQL = `
SELECT id, alias, target_index, coalesce(dual_write_epoch, 0) FROM outbox_rebuilds
 WHERE projection = $1 AND state = 'open'`

// load reads the open rebuild into the cache. The cache's age counts from
// before the query, so it never outlives CacheTTL from what it saw.
func (d *DualWrite) load(ctx context.Context) (openView, error) {
	start := time.Now()
	var v openView
	var alias string
	err := d.pool.QueryRow(ctx, openViewSQL, d.projection).Scan(&v.id, &alias, &v.target, &v.epoch)
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		v = openView{}
	case errors.As(err, &pgErr) && (pgErr.Code == "42501" || pgErr.Code == "42P01"):
		// insufficient_privilege or undefined_table: a replica that cannot
		// read the rebuilds cannot confirm one either, so no rebuild gets
		// past its wait for the confirmation. Go on projecting, and say
		// loudly that rebuilds need the grant.
		d.warnUnreadable(err)
		v = openView{}
	case err != nil:
		return openView{}, err
	case alias != d.index:
		d.warnAlias(v.id, alias)
		v = openView{}
	}
	d.mu.Lock()
	d.cur, d.loadedAt = v, start
	d.mu.Unlock()
	return v, nil
}

// warnAlias says once per rebuild why this replica ignores it: the rebuild
// waits for a confirmation that never comes, and says so too.
func (d *DualWrite) warnAlias(id int64, alias string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.warned != id {
		d.warned = id
		d.log.Warn().Int64("rebuild_id", id).Str("rebuild_alias", alias).Str("index", d.index).
			Msg("ignoring the open rebuild: its alias is not this replica's ELASTIC_INDEX")
	}
}

// warnUnreadable logs at most once a minute that rebuilds are out of reach.
func (d *DualWrite) warnUnreadable(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if time.Since(d.warnedAt) >= time.Minute {
		d.warnedAt = time.Now()
		d.log.Error().Err(err).Msg("cannot read outbox_rebuilds (apply deploy/sql/roles.sql after migrating): " +
			"no rebuild can start until this replica can")
	}
}

const confirmSQL = `
UPDATE outbox_rebuilds
   SET dual_write_at = coalesce(dual_write_at, now()), dual_write_by = $2, dual_write_epoch = $3
 WHERE id = $1 AND state = 'open' AND dual_write_epoch IS DISTINCT FROM $3`

// runOnce refreshes the cache and, the first time this leader sees a
// rebuild, records that it writes to both indexes. The cache is set before
// the confirmation is written, so every batch handled after it dual-writes.
func (d *DualWrite) runOnce(ctx context.Context, epoch int64) error {
	v, err := d.load(ctx)
	if err != nil || v.id == 0 || v.epoch == epoch {
		return err
	}
	tag, err := d.pool.Exec(ctx, confirmSQL, v.id, d.owner, epoch)
	if err != nil {
		return fmt.Errorf("confirm dual-write: %w", err)
	}
	if tag.RowsAffected() == 1 {
		d.log.Info().Int64("rebuild_id", v.id).Str("target_index", v.target).Int64("epoch", epoch).
			Msg("writing to the rebuild's index too")
	}
	return nil
}

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
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
)

const (
	// CacheTTL bounds how old a replica's view of the open rebuild may be
	// when its handler uses it. Run waits twice this after opening, besides
	// the leader's confirmation, so that no replica still acts on a view
	// from before the rebuild opened.
	CacheTTL = 250 * time.Millisecond
	// refreshEvery keeps the leader's view fresh, so the handler almost
	// never waits for the query, and confirms a new rebuild quickly. Under
	// CacheTTL with room for a slow query; shorter bought nothing and, at
	// 100 ms, was a seventh of the leader's CPU at 500 events/s.
	refreshEvery = 200 * time.Millisecond
)

// DualWrite is the leader's side of a rebuild. It tells the search handler
// the rebuild's indexes (projection.RebuildIndexes) from a cache at most
// CacheTTL old, so there is no query per event; and as a leader service it
// refreshes that cache and confirms in the rebuild row, with its epoch and
// a heartbeat every outbox.RebuildHeartbeat, that this leader writes both
// indexes: Run waits for that before it reads the source table, and
// the swap and a rollback need a fresh one from the current epoch.
//
// It keeps writing both after the swap, until --cleanup releases the old
// index, so that a rollback to the old index serves current data. Once it
// has seen a rebuild, it fails batches rather than write one index alone
// while it cannot read the rebuilds: a confirmation it gave must stay true
// for the rest of its term.
type DualWrite struct {
	leader.Periodic
	pool       *pgxpool.Pool
	projection string
	index      string
	owner      string
	leaderName string
	log        zerolog.Logger

	mu       sync.Mutex
	cur      openView
	loadedAt time.Time
	beatID   int64
	beatAt   time.Time
	warned   int64
	warnedAt time.Time
}

// openView is what the handler needs of the rebuild it writes.
type openView struct {
	id     int64
	state  string
	target string
	old    string // written by name; "" when concrete or none
	epoch  int64  // the last leader epoch that confirmed it
	leader string // and the leader name it leads under
}

func (v openView) indexes() projection.Rebuilding {
	if v.id == 0 {
		return projection.Rebuilding{}
	}
	return projection.Rebuilding{Target: v.target, Old: v.old, Swapped: v.state == StateSwapped}
}

var (
	_ projection.RebuildTarget  = (*DualWrite)(nil)
	_ projection.RebuildIndexes = (*DualWrite)(nil)
)

// NewDualWrite makes search write to the rebuild of projectionName (one
// whose alias is search's index) and returns the service that keeps that
// view fresh; owner is this replica's worker id and leaderName the leader
// name it competes under (OUTBOX_LEADER_NAME), recorded with each
// confirmation.
func NewDualWrite(pool *pgxpool.Pool, projectionName string, search *projection.Search, owner, leaderName string, log zerolog.Logger) *DualWrite {
	d := &DualWrite{pool: pool, projection: projectionName, index: search.Index(), owner: owner, leaderName: leaderName,
		log: log.With().Str("service", "rebuild-dual-write").Logger()}
	d.Periodic = leader.Periodic{ServiceName: "rebuild-dual-write", Interval: refreshEvery, Log: log, Once: d.runOnce}
	search.DualWriteTo(d)
	return d
}

// RebuildIndexes implements projection.RebuildIndexes.
func (d *DualWrite) RebuildIndexes(ctx context.Context) (projection.Rebuilding, error) {
	d.mu.Lock()
	cur, fresh := d.cur, time.Since(d.loadedAt) < CacheTTL
	d.mu.Unlock()
	if fresh {
		return cur.indexes(), nil
	}
	v, err := d.load(ctx)
	return v.indexes(), err
}

// RebuildIndex implements projection.RebuildTarget: the rebuild's new index.
func (d *DualWrite) RebuildIndex(ctx context.Context) (string, error) {
	r, err := d.RebuildIndexes(ctx)
	return r.Target, err
}

// openViewSQL reads the rebuild the leader writes, if any: the newest open
// one, or a swapped one whose old index is kept for a rollback.
const openViewSQL = `
SELECT id, alias, state, target_index, CASE WHEN old_is_concrete THEN '' ELSE coalesce(old_index, '') END,
       coalesce(dual_write_epoch, 0), coalesce(dual_write_leader, '')
  FROM (` + outbox.RebuildWrittenSQL + `) r
 WHERE projection = $1`

// load reads the rebuild into the cache. The cache's age counts from
// before the query, so it never outlives CacheTTL from what it saw.
func (d *DualWrite) load(ctx context.Context) (openView, error) {
	start := time.Now()
	var v openView
	var alias string
	err := d.pool.QueryRow(ctx, openViewSQL, d.projection).Scan(&v.id, &alias, &v.state, &v.target, &v.old, &v.epoch, &v.leader)
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		v = openView{}
	case errors.As(err, &pgErr) && (pgErr.Code == "42501" || pgErr.Code == "42P01"):
		// insufficient_privilege or undefined_table: a replica that cannot
		// read the rebuilds cannot confirm one either, so no rebuild gets
		// past its wait for the confirmation. Go on projecting, and say
		// loudly that rebuilds need the grant; but not after having seen
		// one, whose indexes this replica may have confirmed it writes.
		d.mu.Lock()
		seen := d.cur.id
		d.mu.Unlock()
		if seen != 0 {
			return openView{}, fmt.Errorf("cannot read outbox_rebuilds any more, after rebuild #%d: failing the batch "+
				"rather than writing one of its indexes alone: %w", seen, err)
		}
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

// confirmSQL records that the leader of epoch $3 under leader name $4
// writes both indexes, as of now. Only the current leader confirms (the
// epoch is the fencing token), never over a newer epoch. The unbroken run
// of confirmations (dual_write_since) goes on when the last one was this
// term's or the term just before it under the same name; any other term
// in between may not have written the new index (or, after the swap, the
// old one), so the run starts again.
const confirmSQL = `
UPDATE outbox_rebuilds
   SET dual_write_at = coalesce(dual_write_at, now()),
       dual_write_since = CASE WHEN dual_write_leader = $4 AND dual_write_epoch IN ($3, $3 - 1)
                               THEN coalesce(dual_write_since, now()) ELSE now() END,
       dual_write_by = $2, dual_write_epoch = $3, dual_write_leader = $4, dual_write_seen_at = now()
 WHERE id = $1 AND (state = 'open' OR (state = 'swapped' AND released_at IS NULL))
   AND coalesce(dual_write_epoch, 0) <= $3
   AND EXISTS (SELECT 1 FROM outbox_leader WHERE name = $4 AND epoch = $3)`

// runOnce refreshes the cache and confirms that this leader writes both
// indexes: at once the first time it sees the rebuild in its term, then
// every outbox.RebuildHeartbeat. The cache is set before the confirmation
// is written, so every batch handled after it writes both.
func (d *DualWrite) runOnce(ctx context.Context, epoch int64) error {
	v, err := d.load(ctx)
	if err != nil || v.id == 0 {
		return err
	}
	first := v.epoch != epoch || v.leader != d.leaderName
	d.mu.Lock()
	due := first || d.beatID != v.id || time.Since(d.beatAt) >= outbox.RebuildHeartbeat
	d.mu.Unlock()
	if !due {
		return nil
	}
	start := time.Now()
	tag, err := d.pool.Exec(ctx, confirmSQL, v.id, d.owner, epoch, d.leaderName)
	if err != nil {
		return fmt.Errorf("confirm dual-write: %w", err)
	}
	if tag.RowsAffected() != 1 {
		return nil
	}
	d.mu.Lock()
	d.beatID, d.beatAt = v.id, start
	d.mu.Unlock()
	if first {
		d.log.Info().Int64("rebuild_id", v.id).Str("state", v.state).Str("target_index", v.target).Str("old_index", v.old).
			Int64("epoch", epoch).Msg("writing to both indexes of the rebuild")
	}
	return nil
}

package rebuild

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/wlproj/wlproj/internal/serviceutil"
	"github.com/wlproj/wlproj/outbox"
)

// UnconfirmedError is a swap or rollback that the current leader has not
// confirmed, recently enough, that it writes both indexes of the rebuild:
// moving the alias could then serve an index that misses live events.
type UnconfirmedError struct {
	Problem string
	Alias   string
}

func (e *UnconfirmedError) Error() string {
	return e.Problem + "; the leader must run this version of wlproj with ELASTIC_INDEX=" + e.Alias +
		" and read access to outbox_rebuilds (see wlproj status)"
}

// InterruptedError is a rebuild with a leader term since its load began
// that did not confirm writing both indexes: events of that term may be
// missing from the new index (before the swap) or the old one (after it).
type InterruptedError struct {
	Row Row
}

func (e *InterruptedError) Error() string {
	since := "-"
	if e.Row.DualWriteSince != nil {
		since = e.Row.DualWriteSince.UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("dual-writes of rebuild #%d were interrupted after its load began: the leaders have confirmed "+
		"them without a break only since %s", e.Row.ID, since)
}

// confirmation is a rebuild's dual-write confirmation as the database has it.
type confirmation struct {
	leader  string // the leader name of the last confirmation
	epoch   int64  // its epoch
	by      string
	current int64 // the current epoch of that leader name
	holder  string
	// fresh: a heartbeat after the time asked about.
	fresh bool
	// interrupted: the run of confirmations broke after the load began.
	interrupted bool
	since       *time.Time
	// aged: 2×CacheTTL have passed since the rebuild opened.
	aged bool
}

const confirmationSQL = `
SELECT coalesce(r.dual_write_leader, ''), coalesce(r.dual_write_epoch, 0), coalesce(r.dual_write_by, ''),
       coalesce(l.epoch, 0), coalesce(l.holder, ''), coalesce(r.dual_write_seen_at > $2, false),
       r.load_since IS NOT NULL AND r.dual_write_since IS DISTINCT FROM r.load_since, r.dual_write_since,
       clock_timestamp() >= r.started_at + make_interval(secs => $3)
  FROM outbox_rebuilds r
  LEFT JOIN outbox_leader l ON l.name = r.dual_write_leader
 WHERE r.id = $1`

func readConfirmation(ctx context.Context, db Querier, id int64, since time.Time) (confirmation, error) {
	var c confirmation
	err := db.QueryRow(ctx, confirmationSQL, id, since, (2*CacheTTL).Seconds()).Scan(&c.leader, &c.epoch, &c.by,
		&c.current, &c.holder, &c.fresh, &c.interrupted, &c.since, &c.aged)
	if err != nil {
		return c, fmt.Errorf("read the dual-write confirmation: %w", err)
	}
	return c, nil
}

// problem says why c does not confirm that the current leader writes both
// indexes of row, "" when it does.
func (c confirmation) problem(row *Row) string {
	switch {
	case c.leader == "" || c.epoch == 0:
		return fmt.Sprintf("no leader has confirmed dual-writes to %s", row.Target)
	case c.epoch != c.current:
		return fmt.Sprintf("the current leader (epoch %d, worker %s) has not confirmed dual-writes to %s; the last "+
			"confirmation was epoch %d's, by %s", c.current, c.holder, row.Target, c.epoch, c.by)
	case !c.fresh:
		return fmt.Sprintf("the current leader (epoch %d, worker %s) has not confirmed dual-writes to %s recently",
			c.current, c.holder, row.Target)
	}
	return ""
}

// dbNow is the database's clock: the times in the rebuild rows are its.
func dbNow(ctx context.Context, db Querier) (time.Time, error) {
	var now time.Time
	if err := db.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
		return now, fmt.Errorf("read the database's clock: %w", err)
	}
	return now, nil
}

// underConfirmation runs fn in a transaction once the current leader has
// confirmed, with a heartbeat after since, that it writes both indexes of
// row, waiting up to cfg.ConfirmTimeout (and a few heartbeats) for that;
// nil fn only waits. The
// transaction holds the leader's row of outbox_leader FOR SHARE, so no
// replica can take a new epoch until fn is done: the alias moves while the
// leader that confirmed is still the only one that writes.
//
// A broken run of confirmations since the load began is an
// *InterruptedError at once; no confirmation in time an *UnconfirmedError.
func underConfirmation(ctx context.Context, cfg Config, row *Row, since time.Time, fn func(pgx.Tx) error) error {
	// A fresh heartbeat takes up to one interval, whatever the timeout.
	deadline := time.Now().Add(max(cfg.ConfirmTimeout, 3*outbox.RebuildHeartbeat))
	for {
		err := pgx.BeginFunc(ctx, cfg.Pool, func(tx pgx.Tx) error {
			var name string
			err := tx.QueryRow(ctx, `SELECT coalesce(dual_write_leader, '') FROM outbox_rebuilds WHERE id = $1`, row.ID).Scan(&name)
			if err != nil {
				return fmt.Errorf("read the dual-write confirmation: %w", err)
			}
			if name != "" {
				if _, err := tx.Exec(ctx, `SELECT 1 FROM outbox_leader WHERE name = $1 FOR SHARE`, name); err != nil {
					return fmt.Errorf("hold the leader's epoch: %w", err)
				}
			}
			c, err := readConfirmation(ctx, tx, row.ID, since)
			if err != nil {
				return err
			}
			row.DualWriteSince = c.since
			switch p := c.problem(row); {
			case c.interrupted:
				return &InterruptedError{Row: *row}
			case p != "":
				return &UnconfirmedError{Problem: p, Alias: row.Alias}
			case c.leader != name:
				// Another leader name confirmed since the lock: look again.
				return &UnconfirmedError{Problem: "the confirming leader changed", Alias: row.Alias}
			}
			if fn == nil {
				return nil
			}
			return fn(tx)
		})
		var unconfirmed *UnconfirmedError
		if !errors.As(err, &unconfirmed) || time.Now().After(deadline) {
			return err
		}
		if err := serviceutil.Sleep(ctx, confirmPoll); err != nil {
			return err
		}
	}
}

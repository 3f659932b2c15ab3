package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

const (
	// RebuildHeartbeat is how often the leader renews its confirmation that
	// it writes both indexes of a rebuild (package rebuild, DualWrite).
	RebuildHeartbeat = time.Second
	// RebuildStale is the age after which a confirmation no longer counts:
	// a few missed heartbeats, so a leader that stopped confirming shows.
	RebuildStale = 5 * RebuildHeartbeat
)

// RebuildWrite is a rebuild whose two indexes the leader writes: an open
// one, or a swapped one whose old index is kept, and written, for a
// rollback until --cleanup releases it. One per projection, the newest.
type RebuildWrite struct {
	ID         int64
	Projection string
	State      string
	Alias      string
	Target     string
	// Old is the index the alias pointed at when the rebuild opened.
	Old string
	// ConfirmedEpoch, ConfirmedBy and SeenAt are the last confirmation:
	// the leader's epoch and worker id, and its last heartbeat. Zero when
	// no leader has confirmed.
	ConfirmedEpoch int64
	ConfirmedBy    string
	SeenAt         time.Time
	// LeaderEpoch and LeaderHolder are the current leader of the leader
	// name that confirmed; zero when none has.
	LeaderEpoch  int64
	LeaderHolder string
	// Interrupted is set when a leader term since the load began did not
	// confirm: an open rebuild loads again from the start on its next
	// run, a swapped one's old index may miss writes and cannot be rolled
	// back to.
	Interrupted bool
	// Age is how long ago SeenAt was, by the database's clock.
	Age time.Duration
}

// Confirmed says whether the current leader confirmed recently enough
// that it writes both indexes.
func (r RebuildWrite) Confirmed() bool {
	return r.ConfirmedEpoch != 0 && r.ConfirmedEpoch == r.LeaderEpoch && r.Age < RebuildStale
}

// Problem says in an operator's words what is wrong with the dual-writes,
// "" when nothing is.
func (r RebuildWrite) Problem() string {
	switch {
	case r.ConfirmedEpoch == 0:
		return "no leader has confirmed that it writes to " + r.Target + " too"
	case r.ConfirmedEpoch != r.LeaderEpoch:
		return fmt.Sprintf("the current leader (epoch %d, worker %s) has not confirmed; the last confirmation was epoch %d by %s",
			r.LeaderEpoch, r.LeaderHolder, r.ConfirmedEpoch, r.ConfirmedBy)
	case r.Age >= RebuildStale:
		return fmt.Sprintf("the leader (epoch %d, worker %s) last confirmed %s ago", r.LeaderEpoch, r.LeaderHolder,
			r.Age.Round(time.Second))
	case r.Interrupted:
		return "a leader term since the load began did not confirm"
	}
	return ""
}

// RebuildWrittenSQL selects the rebuilds the leader writes both indexes
// of, the newest per projection; package rebuild's leader service reads
// its view with the same condition.
const RebuildWrittenSQL = `
SELECT DISTINCT ON (projection) * FROM outbox_rebuilds
 WHERE state = 'open'
    OR (state = 'swapped' AND released_at IS NULL AND old_index IS NOT NULL AND NOT old_is_concrete)
 ORDER BY projection, id DESC`

const rebuildWritesSQL = `
SELECT r.id, r.projection, r.state, r.alias, r.target_index, coalesce(r.old_index, ''),
       coalesce(r.dual_write_epoch, 0), coalesce(r.dual_write_by, ''), r.dual_write_seen_at,
       coalesce(l.epoch, 0), coalesce(l.holder, ''),
       r.load_since IS NOT NULL AND r.dual_write_since IS DISTINCT FROM r.load_since,
       coalesce(now() - r.dual_write_seen_at, interval '0')
  FROM (` + RebuildWrittenSQL + `) r
  LEFT JOIN outbox_leader l ON l.name = r.dual_write_leader
 ORDER BY r.projection`

// RebuildWrites reads the rebuilds the leader writes both indexes of. A
// database without the rebuilds table, or a role that may not read it,
// has none to show.
func RebuildWrites(ctx context.Context, db Querier) ([]RebuildWrite, error) {
	rows, err := db.Query(ctx, rebuildWritesSQL)
	if err != nil {
		return nil, rebuildWritesErr(err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (RebuildWrite, error) {
		var r RebuildWrite
		var seen *time.Time
		err := row.Scan(&r.ID, &r.Projection, &r.State, &r.Alias, &r.Target, &r.Old, &r.ConfirmedEpoch, &r.ConfirmedBy,
			&seen, &r.LeaderEpoch, &r.LeaderHolder, &r.Interrupted, &r.Age)
		if seen != nil {
			r.SeenAt = *seen
		}
		return r, err
	})
	if err != nil {
		return nil, rebuildWritesErr(err)
	}
	return out, nil
}

func rebuildWritesErr(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42501" || pgErr.Code == "42P01") {
		return nil
	}
	return fmt.Errorf("snapshot rebuilds: %w", err)
}

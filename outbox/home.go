package outbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// A position and a queued row's xid count one cluster's transactions. A
// database dumped and restored into another cluster, or copied there by
// logical replication, brings positions from the old counter, which the
// new one may be far below: every new row would lie behind them, done
// unread, and the rotation would truncate it. outbox_queue_home (schema 23)
// records the cluster the positions belong to; a replica leads only on
// that cluster, with no saved position ahead of its counter, until an
// operator rebases the queue (Rebase).

// Home is what CheckHome found.
type Home struct {
	// Recorded is the system identifier outbox_queue_home holds, 0 when
	// the row is missing; Here is the server's (pg_control_system).
	Recorded, Here int64
	RecordedBy     string
	RecordedAt     time.Time
	// Furthest is the highest xmax of the origin and the saved positions;
	// Next is this cluster's next transaction id.
	Furthest, Next uint64
	// Unchecked is true before schema 23: there is no record to compare.
	Unchecked bool
}

// Problem says why the queue may not be read on this cluster, "" when it
// may. The text names the cause and the command.
func (h Home) Problem() string {
	const fix = "; new events would lie behind the saved positions and never be sent. " +
		"Run `wlproj queue rebase --by WHO --why TEXT` (runbook: Moving the database to another cluster)"
	switch {
	case h.Unchecked:
		return ""
	case h.Recorded == 0:
		return "outbox_queue_home is empty: no record of the cluster the queue's positions belong to" + fix
	case h.Recorded != h.Here:
		return fmt.Sprintf("the queue's positions were saved on another Postgres cluster (system identifier %d; "+
			"this server's is %d, recorded by %s): the database was restored from a dump or copied into another "+
			"cluster, and its positions count the other cluster's transactions%s", h.Recorded, h.Here, h.RecordedBy, fix)
	case h.Furthest > h.Next:
		return fmt.Sprintf("a saved position (transaction %d) lies ahead of this cluster's transaction counter (%d): "+
			"the database was restored into a cluster whose counter is behind the one that saved it%s", h.Furthest, h.Next, fix)
	}
	return ""
}

// homeSQL reads the record, the server's identifier, the furthest saved
// snapshot and the counter in one statement. pg_control_system() is
// executable by every role.
const homeSQL = `
SELECT coalesce(h.system_identifier, 0), s.system_identifier, coalesce(h.recorded_by, ''), h.recorded_at,
       greatest((SELECT max(pg_snapshot_xmax(snapshot)) FROM outbox_queue_origin),
                (SELECT max(greatest(pg_snapshot_xmax(done_cur), pg_snapshot_xmax(claimed_cur))) FROM outbox_positions),
                '0'::xid8)::text,
       pg_snapshot_xmax(pg_current_snapshot())::text
  FROM pg_control_system() s LEFT JOIN outbox_queue_home h ON true`

// CheckHome reads where the queue's positions belong against this server.
func CheckHome(ctx context.Context, db Querier) (Home, error) {
	var h Home
	var at pgtype.Timestamptz
	var furthest, next string
	err := db.QueryRow(ctx, homeSQL).Scan(&h.Recorded, &h.Here, &h.RecordedBy, &at, &furthest, &next)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
		return Home{Unchecked: true}, nil // before schema 23
	}
	if err != nil {
		return h, fmt.Errorf("queue home: %w", err)
	}
	h.RecordedAt = at.Time
	h.Furthest, _ = strconv.ParseUint(furthest, 10, 64)
	h.Next, _ = strconv.ParseUint(next, 10, 64)
	return h, nil
}

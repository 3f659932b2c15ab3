package outbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/wlproj/wlproj/internal/serviceutil"
)

// rotationSlots is how many partitions a rotated table has: one current,
// written; one of the last period, read; one to open again. PgQ rotates
// its event tables the same way.
const rotationSlots = 3

// rotated names a table rotated over rotationSlots partitions by TRUNCATE:
// a held vacuum horizon delays no TRUNCATE, where it keeps every row a
// DELETE removed.
type rotated struct {
	what      string // for messages: "the ledger"
	table     string // its one-row rotation table
	partition string // its partitions' names, but for the slot
	empty     int    // the slot rows go to without the rotation's row
}

var (
	ledgerRotated = rotated{what: "the ledger", table: "outbox_ledger_rotation", partition: "outbox_ledger_", empty: 0}
	eventsRotated = rotated{what: "the outbox", table: "outbox_events_rotation", partition: "outbox_events_", empty: 1}
)

// partitionOf is the name of the partition of slot.
func (r rotated) partitionOf(slot int) string {
	return r.partition + strconv.Itoa(slot)
}

// current reads the current slot and whether it has been current for
// period or longer.
func (s *Store) current(ctx context.Context, r rotated, period time.Duration) (slot int, due bool, err error) {
	err = s.Pool.QueryRow(ctx, `SELECT slot, opened_at <= now() - make_interval(secs => $1) FROM `+r.table,
		period.Seconds()).Scan(&slot, &due)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, fmt.Errorf("%w: %s's rotation has no row (%s was emptied): INSERT INTO %s (slot) VALUES (%d) "+
			"as the owner; rows go to partition %d meanwhile", ErrNoRotationRow, r.what, r.table, r.table, r.empty, r.empty)
	}
	if err != nil {
		return 0, false, fmt.Errorf("read %s's rotation: %w", r.what, err)
	}
	return slot, due, nil
}

// ErrNoRotationRow is a rotation that cannot run because its one-row
// table was emptied by hand; its error says how to put the row back.
var ErrNoRotationRow = errors.New("rotation row missing")

// errNotReopened rolls back a reopening that its guard refused.
var errNotReopened = errors.New("the rotation moved or the leader was deposed")

// HeldError is a due reopening that waited: the partition still holds a
// row something needs, which Reason names. The next round tries again.
type HeldError struct {
	Reason string
	cause  error
}

func (e *HeldError) Error() string { return "the partition still holds " + e.Reason }

func (e *HeldError) Unwrap() error { return e.cause }

// reopen empties partition next and makes it current, in one transaction
// under the leader's fencing guard and only if cur is still current: a
// deposed leader's rotation, or a second one racing it, changes nothing
// (errNotReopened). Once the partition is locked, held (when given) says
// what in it is still needed, if anything: then nothing changes
// (*HeldError). The partition's lock is taken NOWAIT: while another
// session holds one on it (a reader, a dump), the rotation waits for the
// next round rather than queue every reader of the outbox behind its
// request; lock_timeout bounds the rest.
func (s *Store) reopen(ctx context.Context, epoch int64, r rotated, cur, next int,
	held func(context.Context, pgx.Tx) (string, error)) error {
	var err error
	for range reopenTries {
		err = s.reopenOnce(ctx, epoch, r, cur, next, held)
		if !errors.Is(err, errPartitionLocked) {
			return err
		}
		if err := serviceutil.Sleep(ctx, reopenPause); err != nil {
			return err
		}
	}
	return err
}

// reopenTries and reopenPause: a statement's lock on the partition lasts
// milliseconds, so a few tries a tenth of a second apart find a gap
// between the leader's own reads; a transaction that holds it (a dump)
// still holds the rotation until a later round.
const (
	reopenTries = 10
	reopenPause = 100 * time.Millisecond
)

// errPartitionLocked is a HeldError for a lock another session holds.
var errPartitionLocked = errors.New("partition locked")

// reopenOnce is one try of reopen.
func (s *Store) reopenOnce(ctx context.Context, epoch int64, r rotated, cur, next int,
	held func(context.Context, pgx.Tx) (string, error)) error {
	return pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '1s'`); err != nil {
			return fmt.Errorf("reopen %s: %w", r.partitionOf(next), err)
		}
		tag, err := tx.Exec(ctx, `UPDATE `+r.table+` SET slot = @next, opened_at = now()
		  WHERE slot = @cur AND `+leaderGuard, s.args(epoch, pgx.NamedArgs{"cur": cur, "next": next}))
		if err != nil {
			return fmt.Errorf("reopen %s: %w", r.partitionOf(next), err)
		}
		if tag.RowsAffected() == 0 {
			return errNotReopened
		}
		if _, err := tx.Exec(ctx, `LOCK TABLE `+r.partitionOf(next)+` IN ACCESS EXCLUSIVE MODE NOWAIT`); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == LockNotAvailable {
				return &HeldError{Reason: "a lock another session holds on " + r.partitionOf(next) +
					" (a statement or a transaction that read it: a long query, a dump)", cause: errPartitionLocked}
			}
			return fmt.Errorf("reopen %s: %w", r.partitionOf(next), err)
		}
		if held != nil {
			reason, err := held(ctx, tx)
			if err != nil {
				return fmt.Errorf("reopen %s: %w", r.partitionOf(next), err)
			}
			if reason != "" {
				return &HeldError{Reason: reason}
			}
		}
		if _, err := tx.Exec(ctx, `TRUNCATE `+r.partitionOf(next)); err != nil {
			return fmt.Errorf("reopen %s: %w", r.partitionOf(next), err)
		}
		return nil
	})
}

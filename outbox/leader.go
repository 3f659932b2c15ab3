package outbox

import (
	"fmt"
	"time"
)

// The election's SQL lives here, next to the leader table it writes and the
// status query that reads it, so the lock key is written once.

// lockKey is the advisory-lock key of a leader name: one bigint, which
// pg_locks shows split into classid (high half) and objid (low half).
const lockKey = `hashtextextended(%s, 0)`

// LockSQL blocks until this session holds the leader lock of the name $1,
// or until the session's lock_timeout ends the wait (SQLSTATE 55P03). A
// statement holds a snapshot for as long as it runs, and a snapshot anywhere
// in the database holds back vacuum of every table in it, so the elector
// waits in slices of LockWaitSlice and runs this again after each.
var LockSQL = "SELECT pg_advisory_lock(" + fmt.Sprintf(lockKey, "$1") + ")"

// LockWaitSlice is the longest one LockSQL statement waits: the oldest
// snapshot a standby's wait may hold. Postgres hands a released lock to a
// waiter at once, and a statement started after the release takes it at
// once, so the slice bounds the snapshot without slowing a takeover.
const LockWaitSlice = time.Second

// LockNotAvailable is the SQLSTATE of a lock wait ended by lock_timeout.
const LockNotAvailable = "55P03"

// UnlockSQL releases the leader lock of the name $1.
var UnlockSQL = "SELECT pg_advisory_unlock(" + fmt.Sprintf(lockKey, "$1") + ")"

// BumpEpochSQL records holder $2 as leader of name $1 and returns the new
// epoch: the fencing token every claim and ack of this leader carries.
const BumpEpochSQL = `
INSERT INTO outbox_leader (name, holder, epoch, acquired_at) VALUES ($1, $2, 1, now())
ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, epoch = outbox_leader.epoch + 1, acquired_at = now()
RETURNING epoch`

// EpochSQL reads the current epoch of the name $1.
const EpochSQL = `SELECT epoch FROM outbox_leader WHERE name = $1`

// HeadChannel asks the leader to claim from the head of the outbox at once:
// rows that fall due behind its claim cursor (a resumed projection, a
// repair's events) are found only there. The leader listens to it all the
// time; no insert notifies it, so it costs nothing under load.
const HeadChannel = "outbox_head"

// NotifyHeadSQL sends HeadChannel's notification, at the commit of the
// transaction it runs in.
var NotifyHeadSQL = "SELECT pg_notify('" + HeadChannel + "', '')"

// NotifyChannel is the channel the insert trigger (migration 00001) notifies;
// migrations' tests check the two agree.
const NotifyChannel = "outbox_events"

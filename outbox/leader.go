package outbox

import (
	"fmt"
	"strconv"
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

// EpochsPerTimeline is how many epochs each Postgres timeline owns:
// timeline t's epochs start at (t-1)*EpochsPerTimeline + 1, so a
// thousand-million elections would have to happen on one timeline before
// two could share an epoch. Timeline 1, a cluster never promoted, counts
// from 1 as wlproj always has; a power of ten keeps the timeline readable
// in the epoch (2000000007 is timeline 3's seventh term).
const EpochsPerTimeline = 1_000_000_000

// TimelineSQL is the timeline a primary writes on: the first eight hex
// digits of its current WAL file's name. Unlike pg_control_checkpoint() it
// needs no grant, and unlike the last checkpoint's timeline it changes the
// moment a standby is promoted. It fails on a standby (pg_walfile_name
// refuses during recovery); a standby hands out no epochs.
const TimelineSQL = `('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint`

// BumpEpochSQL records holder $2 as leader of name $1 and returns the new
// epoch: the fencing token every claim and ack of this leader carries.
//
// The epoch is the next one, but at least the first of the server's
// timeline (EpochsPerTimeline). A promoted standby inherits its old
// primary's epochs; if the old primary comes back as a primary too (a
// split brain), both would count on from the same number and hand out the
// same tokens, and a claim meant for one server would pass the fencing guard
// on the other. With the timeline in the epoch, every epoch of the newer
// timeline is above every epoch the old one reaches, so a token is never
// valid on both.
var BumpEpochSQL = `
INSERT INTO outbox_leader (name, holder, epoch, acquired_at)
VALUES ($1, $2, (` + TimelineSQL + ` - 1) * ` + strconv.Itoa(EpochsPerTimeline) + ` + 1, now())
ON CONFLICT (name) DO UPDATE
   SET holder = excluded.holder, epoch = greatest(outbox_leader.epoch + 1, excluded.epoch), acquired_at = now()
RETURNING epoch`

// RecordProjectionsSQL stores for leader $1, at its epoch $2, the hash $3
// of the projections it runs (replica.Specs.Hash; schema 22): the replicas
// and `wlproj status` compare theirs with it. A deposed leader's late
// record (an older epoch) changes nothing.
const RecordProjectionsSQL = `
INSERT INTO outbox_leader_projections (name, epoch, projections) VALUES ($1, $2, $3)
ON CONFLICT (name) DO UPDATE SET epoch = excluded.epoch, projections = excluded.projections, recorded_at = now()
 WHERE outbox_leader_projections.epoch <= excluded.epoch`

// LeaderProjectionsSQL reads what RecordProjectionsSQL stored for leader
// $1 at its current epoch: none for a leader of a binary before 22, whose
// epoch has no record, rather than the hash of the leader before it.
const LeaderProjectionsSQL = `
SELECT p.projections FROM outbox_leader_projections p JOIN outbox_leader l ON l.name = p.name AND l.epoch = p.epoch
 WHERE p.name = $1`

// EpochSQL reads the current epoch of the name $1.
const EpochSQL = `SELECT epoch FROM outbox_leader WHERE name = $1`

// HeadChannel asks the leader to claim from the head of the outbox at once:
// rows that fall due behind its claim cursor (a resumed projection, a
// repair's events) are found only there. The leader listens to it while it
// is idle; a busy leader claims from the head every poll interval anyway.
const HeadChannel = "outbox_head"

// NotifyHeadSQL sends HeadChannel's notification, at the commit of the
// transaction it runs in.
var NotifyHeadSQL = "SELECT pg_notify('" + HeadChannel + "', '')"

// NotifyChannel is the channel the insert trigger (migration 00001) notifies;
// migrations' tests check the two agree.
const NotifyChannel = "outbox_events"

// Package leader elects the single active replica. Each replica holds a
// dedicated connection (not from the pool) and waits on it in
// pg_advisory_lock; Postgres grants the lock to the next waiter the moment the
// holder's session ends, which is what makes failover after kill -9 take
// milliseconds rather than a lease timeout.
//
// The wait is a series of statements, each ended by the lock session's
// lock_timeout after outbox.LockWaitSlice: a running statement holds a
// snapshot, and a standby that waited in one statement for hours would stop
// vacuum in the whole database (the application's tables included) for
// hours. A statement started after the leader's session ends takes the lock
// at once, so the slices cost a takeover nothing.
//
// On winning, the replica increments the epoch in outbox_leader and uses it as
// its fencing token: every claim and ack checks it, so a deposed leader's late
// writes change nothing. The leader checks its lock connection every
// CheckInterval; if the check fails it cancels its services at once and goes
// back to standby.
//
// An epoch is unique to the Postgres timeline it was taken on
// (outbox.BumpEpochSQL): after a failover the promoted standby's epochs are
// above any its old primary can reach, so if the old primary comes back as
// a primary, a token valid on one server matches nothing on the other.
//
// Fencing alone would still let a leader lead on the wrong server, so a
// replica also refuses to lead while Postgres has split: when another host
// DATABASE_URL lists is a primary on a timeline as new as, or newer than,
// the server of its lock connection, or when its pool reaches another
// server than its lock connection (Elector.PoolServers). It asks before it
// waits for the lock, on winning, and every ServerCheckInterval while it
// leads, each host on a short connection of its own; a leader that finds a
// split steps down as at shutdown. It says why in outbox_leader_refused and
// an error line naming both servers, and asks again every
// ServerCheckInterval until the split is resolved.
//
// A replica campaigns only while its Elector.CanLead allows it: the replica
// allows it while the database's schema is one its binary runs on. Until
// then it opens no lock connection, a standby gives up its wait at the next
// slice, and a leader steps down as at shutdown.
package leader

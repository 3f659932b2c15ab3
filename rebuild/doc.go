// Package rebuild rebuilds a projection's search index from its source of
// truth (SoT), a Postgres table the application keeps, with no downtime:
// readers query ELASTIC_INDEX, an alias, which moves to the new index in one
// _aliases call once it is complete.
//
// A rebuild is a row of outbox_rebuilds:
//
//	open ──swap──▶ swapped ──cleanup──▶ cleaned   (the old index deleted)
//	  └───abort──▶ aborted ──cleanup──▶ cleaned   (the new index deleted)
//
// Each change of state is one statement that checks the current state,
// written in one transaction with its audit row (outbox_replay_audit,
// action 'rebuild').
//
// # Why no event is lost: dual-write, then snapshot
//
// While a rebuild is open, the leader's search handler writes every bulk to
// the rebuild's index and then to the alias (DualWrite, a leader service
// with a small cache of the open rebuild). Run waits until a leader has
// recorded in the row that it does so, and until every replica's cache
// predating the rebuild has expired, and only then opens a REPEATABLE READ
// snapshot of the source table. So:
//
//   - an event committed before the snapshot changed the source table in
//     the same transaction: the snapshot holds its row (or its absence);
//   - an event committed after it is claimed, and handled, after the
//     confirmation: it reaches the new index by dual-write.
//
// Both paths carry the same external versions (external_gte), so which one
// reaches the engine first does not matter. The ledger (outbox_applied)
// stays the judge of staleness: the loader drops source rows that the
// ledger already holds a newer version (or a delete) of, because the
// engine forgets a delete after index.gc_deletes and a long load could
// otherwise bring a document back.
//
// # Crash and re-run
//
// The alias moves only after the load has finished and the new index is
// refreshed, so it never points at a half-built index. The row remembers the
// last source key whose rows the engine confirmed; a re-run of the same
// command resumes after it with a new snapshot, which is sound because
// dual-writes went on in between. One rebuild per projection runs at a time
// (an advisory lock held by the running command; the row stays open).
package rebuild

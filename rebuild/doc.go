// Package rebuild rebuilds a projection's search index from its source of
// truth (SoT), a Postgres table the application keeps, with no downtime:
// readers query ELASTIC_INDEX, an alias, which moves to the new index in one
// _aliases call once it is complete.
//
// A rebuild is a row of outbox_rebuilds:
//
//	open ──swap──▶ swapped ──cleanup──▶ cleaned   (the old index deleted)
//	  │               └──rollback──▶ rolled_back ──cleanup──▶ cleaned
//	  └───abort──▶ aborted ──cleanup──▶ cleaned   (the new index deleted)
//
// Each change of state is one statement that checks the current state,
// written in one transaction with its audit row (outbox_replay_audit,
// action 'rebuild').
//
// # Why no event is lost: dual-write, then pages
//
// While a rebuild is open, the leader's search handler writes every bulk to
// the rebuild's index and then to the old one (DualWrite, a leader service
// with a small cache of the rebuild). The leader confirms in the row that
// it does, with its epoch, at the start of its term and then every
// outbox.RebuildHeartbeat. Run waits for a confirmation by the current
// epoch, and until every replica's cache predating the rebuild has
// expired, and only then reads the source table: in key-ordered pages,
// each page a statement of its own (one snapshot for the whole table would
// stop vacuum in the whole database for as long as the load takes). Each
// document is read once, in the page whose key range holds it, and for
// that document:
//
//   - an event committed before its page's statement changed the source
//     table in the same transaction: the page holds its row (or its
//     absence);
//   - an event committed after it is claimed, and handled, by a leader
//     that confirmed: it reaches the new index by dual-write.
//
// A document written between two pages is read at its newer version if
// its key lies ahead, and carried by dual-write either way; one created
// behind the pages read so far comes by dual-write alone. No page is read
// before the confirmation, so the argument holds for each page as it did
// for one snapshot of the whole table.
//
// The second holds only if every leader term since the first page confirmed:
// a failover to a replica with another ELASTIC_INDEX, without the grant,
// or running an older binary writes one index alone. A confirmation
// continues the run of confirmations (dual_write_since) only when the last
// one was its own term's or the one just before; the load records the run
// it began under (load_since), and a break since makes Run load every row
// again. The swap needs a heartbeat of the current epoch newer than its
// start, and moves the alias holding the leader's outbox_leader row FOR
// SHARE, so no new epoch begins before the swap is recorded.
//
// Both paths carry the same external versions (external_gte), so which one
// reaches the engine first does not matter. The ledger (outbox_ledger)
// stays the judge of staleness: the loader drops source rows that the
// ledger already holds a delete of (at their version or newer), because
// the engine forgets a delete after index.gc_deletes and a long load could
// otherwise bring a document back. A row older than a live version the
// ledger holds is behind: the application wrote the newer event without
// the row, and dual-write brings only versions applied after the rebuild
// opened, so the load copies the old index's document, which holds the
// newer version, at the old index's version (Behind). --emit-outbox judges
// the same way, and its events carry the repair mark, so that one at the
// version the ledger holds from the producer's own event is sent.
//
// # No swap loses a document
//
// Before the swap, the documents whose rows the rebuild refused (the new
// mapping, a payload over the limit, an emitted event that failed or was
// discarded) are looked up in both indexes: while the old one has any the
// new one lacks, the swap is refused and the rebuild stays open (guard),
// unless Config.AllowRefused, which the swap's audit row records. A run
// that resumed after refusing rows no longer knows them, and finds them by
// reading the source table again.
//
// # Rollback
//
// After the swap the leader goes on writing both indexes, by name, until
// Cleanup releases the old one (released_at), so that Rollback, which
// moves the alias back under the same confirmation rules, serves current
// documents. Cleanup deletes a released index only AbortGrace later, by
// the database's clock: a bulk in flight to a deleted index would create
// it again.
//
// # Crash and re-run
//
// The alias moves only after the load has finished and the new index is
// refreshed, so it never points at a half-built index. The row remembers the
// last source key whose rows the engine confirmed; a re-run of the same
// command resumes after it, which is sound because dual-writes went on in
// between. One rebuild per projection runs at a time
// (an advisory lock held by the running command; the row stays open).
package rebuild

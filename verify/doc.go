// Package verify proves that the search index holds what the database
// says it should (wlproj verify), puts right what it does not (--repair),
// and does both on a schedule as a leader service.
//
// The truth is the source table (the rebuild's search_index: one row per
// live document at its version) when one is given, else the applied-version
// ledger. Every document that differs falls in one kind:
//
//	missing      in the truth (the source, or live in the ledger), absent from the index
//	stale        in the index at an older version than the truth
//	resurrected  in the index while the ledger says it was deleted
//	extra        in the index, absent from the source, not deleted in the ledger
//	ahead        in the index at a newer version than the source (with a table only)
//
// Without a source table nothing can be called extra: the pruner drops live
// documents' ledger entries after the retention, so an index document with
// no entry is normal.
//
// How it reads, in bounded memory and on every engine of the matrix
// (Elasticsearch 8 refuses to sort on _id, so no merge of two sorted
// streams):
//
//  0. With a source table, the whole index (a scroll) and the whole table
//     (key-ordered pages) are read side by side into an order-free
//     fingerprint of their (_id, version) pairs. Equal, the index is
//     clean: one read of each side, no lookup. This is the common case,
//     and what makes a run cost about the slower of the two reads. The
//     scheduled verify skips it (Config.Documents): beside a live drain
//     the two sides never match as wholes. Otherwise, or without a table,
//     document by document:
//  1. One scroll of the index in _doc order (versions on, _source off).
//     Each page of ids is looked up in the database (source row and ledger
//     entry, by primary key) and judged.
//  2. The database's keys (the table's, or the live ledger entries'), in
//     key-ordered pages, each looked up in the index with one ids query:
//     what the index lacks is missing.
//  3. Every document found different is checked again, in batches: the
//     database, the index (a realtime _mget), then the database again.
//     The live drain moves on while verify reads, so only a document that
//     still differs, that both reads of the database saw alike, and that
//     had no event pending or processing in either, is drift.
//
// Every page of every step, and each read of step 3, is a statement of its
// own: a snapshot held for a whole (rate-capped) run would stop vacuum in
// the whole database for as long, the outbox's dead rows and the
// application's alike. A repair likewise queues its events in short
// transactions (see Repair), never one open across the run.
//
// A repair never deletes a document the ledger says is live at the
// delete's version or newer: such an extra document is not repairable
// (LedgerLive), the leader drops such a repair event unsent (the ledger
// may move after the verify judged), and the scheduled verify's automatic
// repair, which deletes through the engine itself, reads the ledger and
// the events in flight once more just before its delete.
//
// Only pages, a batch of suspects and the samples are held in memory.
package verify

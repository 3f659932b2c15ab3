// Package replay is the way out of failed: the triage listing an operator
// looks at, the audited actions that end a failed row, and the auto-replay
// service the leader runs for transient failures.
//
// Failed is terminal: the daemon never revives a row by itself. Every way
// out is a decision someone made, so each action that changes anything
// writes one row to outbox_replay_audit (its action, who, why, when, the
// selector, the ids):
//
//	failed ──Replay──▶ pending          the cause is fixed
//	failed ──Discard─▶ discarded        never wanted again; terminal
//	failed, discarded ──Archive──▶ outbox_dead_letter (every column kept)
//	outbox_dead_letter ──Restore──▶ pending, same id   failed ones only:
//	                                                    discarded stays discarded
//
// Replay, discard and restore append an entry to the row's error_history;
// errors, attempts (unless reset) and history are kept, so a row that fails
// again still tells its whole story. All four share one path (action.go):
// select and lock, refuse by id or by the cap with nothing changed, write
// the audit row, change the rows with a compare-and-set on their status.
// A dry run reads the same selection without locking it, a page per
// transaction (preview.go).
// Replaying is safe because projections write with deterministic document
// ids: a repeated event gives the same document.
//
// The daemon decides a terminal failure after a try, so a replayed row always
// gets at least one more real try, even when its attempts are at the cap.
//
// The reads of triage beyond List and Stats (query.go: keyset pages in
// several orders, counts, a row with its payload and history, the audit
// log) serve the operator console; the filters are the actions' selectors,
// so what a page shows is what an action on its filter takes. A dry run's
// Report.Token, given back as Request.Expect, holds the action to exactly
// the rows the dry run showed.
//
// Auto-replay revives only failures of the dependency (classify.AutoReplayable)
// while the engine is healthy, at a bounded rate, audited as by "auto";
// deterministic failures need their cause fixed and a person to replay them.
package replay

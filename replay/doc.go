// Package replay is the way back from failed: the triage listing an operator
// looks at, the audited replay that returns failed rows to pending, and the
// auto-replay service the leader runs for transient failures.
//
// Failed is terminal: the daemon never revives a row by itself. A replay is a
// decision someone made, so every replay that changes anything writes one row
// to outbox_replay_audit (who, why, when, the selector, the ids), and appends a
// "replayed" entry to each row's error_history. Errors, attempts (unless
// reset) and history are kept, so a row that fails again still tells its
// whole story. Replaying is safe because projections write with
// deterministic document ids: a repeated event gives the same document.
//
// The daemon decides a terminal failure after a try, so a replayed row always
// gets at least one more real try, even when its attempts are at the cap.
//
// Auto-replay revives only failures of the dependency (classify.AutoReplayable)
// while the engine is healthy, at a bounded rate, audited as by "auto";
// deterministic failures need their cause fixed and a person to replay them.
package replay

// Package console is the operator's web UI: an overview of the outbox and
// its replicas, the failed and the archived rows with their payloads and
// histories, the audit log, and the audited actions on failed rows (replay,
// discard, archive), on archived rows (restore) and on projections (pause,
// resume), served by every replica.
//
// It decides nothing of its own about rows: every read goes through
// outbox and replay, and every action through replay's action path, the
// one the CLI uses, with the same caps, refusals and audit rows. The
// signed-in user is the audit row's "by"; "why" is required. A restore
// inserts events, which the least-privilege runtime role may not: on a
// replica running as it, the console refuses and names the CLI command.
//
// An action is a dry run, then a confirmation, then the action:
//
//	filter, selection or one row ──dry run──▶ N rows, token T
//	     confirm with why ──apply(expect T)──▶ done, audit id
//	                        └─ rows changed since ──▶ refused, nothing changed
//
// The token (replay.SelectionToken) names the dry run's rows; the action
// refuses unless it selects exactly those, so a confirmation given for N
// rows never applies to others. An archive, whose request takes no token,
// runs in a transaction the console rolls back unless it moved those rows.
//
// Security: sign-in against a file of bcrypt hashes, or through an OpenID
// provider (oidc.go: code flow with PKCE, state and nonce), sessions in signed and
// encrypted cookies (HttpOnly, SameSite=Strict, Secure over TLS), each
// signed-in one also a row of outbox_console_sessions that every request
// checks, so sign-out and a password change end it everywhere, a session
// token in every form plus the browser's own cross-origin check on every
// POST, rate-limited sign-in, a CSP without any script, no framing. Pages
// are html/template, so payloads and error texts are always text.
package console

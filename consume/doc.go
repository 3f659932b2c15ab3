// Package consume is the leader's work: the loop that claims batches of due
// events, hands each batch to the handler registered for its projection and
// records the outcome (done, retry with backoff, or failed), and the
// reclaimer that returns stuck rows to pending. The loop knows nothing about
// projections or business fields: it pulls, calls, records. What differs
// between projections is declared by their handlers: only one that is
// projection.LatestOnly has its stale events dropped by the ledger and its
// applied events recorded there.
package consume

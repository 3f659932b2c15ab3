// Package outbox is the storage of the outbox table: the claim, the acks and
// the reclaim, each one compare-and-set statement fenced by the leader epoch.
//
// The lifecycle of a row:
//
//	           claim (leader, epoch)
//	pending ───────────────────────────▶ processing ──── ack done ────▶ done
//	 ▲  ▲        locked_by, claim_token,      │  │
//	 │  │        lease_until,                 │  └── ack failed ─────▶ failed
//	 │  │        processing_started_at        │     (deterministic, or     │
//	 │  │                                     │      attempts exhausted)   │
//	 │  └── ack retry (attempts+1, backoff) ──┤                            │
//	 │  └── reclaim (lease expired, stuck,    │                            │
//	 │       or claimed by an older epoch) ───┘                            │
//	 └────────────── replay (audited, by an operator or auto) ─────────────┘
//
// The claim passes over the rows of a projection an operator paused
// (outbox_projection_state, SetPaused): they wait in pending, audited, and
// hold up no row behind them.
//
// A row leaves processing only through a statement whose WHERE clause checks
// status, owner and claim token, and that the token is still the current
// leader epoch, so a deposed leader's late writes change nothing.
package outbox

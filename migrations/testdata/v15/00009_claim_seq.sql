-- +goose Up
-- Each claim gets a number of its own, so an ack matches the claim that took
-- the row and not just the leader's term: when a lease runs out while the
-- leader's own batch is in flight and the same leader claims the rows again,
-- the old flight's ack must change nothing. Nullable, no default: adding it
-- rewrites nothing and holds its lock for an instant.
ALTER TABLE outbox_events ADD COLUMN claim_seq bigint;

-- +goose Down
ALTER TABLE outbox_events DROP COLUMN IF EXISTS claim_seq;

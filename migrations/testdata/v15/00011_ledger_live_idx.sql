-- +goose NO TRANSACTION
-- +goose Up
-- The pruner removes live documents' ledger entries too, oldest first, after
-- OUTBOX_RETENTION: the engine keeps a live document's version itself. Built
-- CONCURRENTLY so that acks, which write this table, do not wait for it on a
-- ledger of millions of entries; a run that failed half-way leaves an
-- invalid index, which the DROP clears before the next try.
DROP INDEX CONCURRENTLY IF EXISTS outbox_applied_live_idx;
CREATE INDEX CONCURRENTLY outbox_applied_live_idx ON outbox_applied (applied_at) WHERE NOT deleted;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS outbox_applied_live_idx;

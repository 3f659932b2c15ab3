-- +goose NO TRANSACTION
-- +goose Up
-- The auto-replay budget sums the last minute of by='auto' audit rows on every
-- tick; operators ask "who replayed what, when" of the same columns. Built
-- CONCURRENTLY: the leader's auto-replay writes this table.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_replay_audit_by_time_idx ON outbox_replay_audit (replayed_by, replayed_at);

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS outbox_replay_audit_by_time_idx;

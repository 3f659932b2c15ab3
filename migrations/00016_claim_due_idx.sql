-- +goose NO TRANSACTION
-- +goose Up
-- The claim's index: each projection's pending rows in the order they fall
-- due. The claim reads only projections that are not paused, and in each
-- only the rows already due, so neither a paused projection's backlog nor
-- rows waiting out a backoff are walked past on every claim (300k of either
-- made a claim of the id-ordered pending index take ~90 ms instead of 0.5).
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_events_due_idx ON outbox_events (projection, next_retry_at, id) WHERE status = 'pending';

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS outbox_events_due_idx;

-- +goose Up
-- A producer may write the W3C traceparent of the request that made the
-- change (00-<trace id>-<span id>-<flags>); the leader's batch span then
-- links to that trace, so an event can be followed from the application's
-- request to the index. Optional: NULL (the default for existing and new
-- rows) is no link. A nullable column without a default changes only the
-- catalog: outbox_events is not rewritten.
ALTER TABLE outbox_events ADD COLUMN traceparent text;

-- +goose Down
ALTER TABLE outbox_events DROP COLUMN IF EXISTS traceparent;

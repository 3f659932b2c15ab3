-- +goose Up
-- The applied-version ledger: per projection and document, the newest
-- version the projection confirmed, and whether it was a delete. The engine
-- forgets a delete's version after index.gc_deletes (60 s) or a restart, so
-- external versioning alone would let a late replay of an older upsert bring
-- a deleted document back; the leader checks this table before sending.
-- +goose StatementBegin
CREATE TABLE outbox_applied (
    projection  text        NOT NULL,
    entity_type text        NOT NULL,
    entity_id   text        NOT NULL,
    version     bigint      NOT NULL,
    deleted     boolean     NOT NULL,
    event_id    bigint      NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (projection, entity_type, entity_id)
);
-- +goose StatementEnd

-- The pruner removes old delete entries, oldest first.
CREATE INDEX outbox_applied_deleted_idx ON outbox_applied (applied_at) WHERE deleted;

-- The pruner removes done rows older than the retention, oldest ack first.
CREATE INDEX outbox_events_done_idx ON outbox_events (processed_at) WHERE status = 'done';

-- What was applied before the ledger existed: the newest done event of each
-- document (version = event_version, or the outbox id when null).
INSERT INTO outbox_applied (projection, entity_type, entity_id, version, deleted, event_id, applied_at)
SELECT DISTINCT ON (projection, entity_type, entity_id)
       projection, entity_type, entity_id, coalesce(event_version, id), op = 'delete', id, coalesce(processed_at, now())
  FROM outbox_events
 WHERE status = 'done'
 ORDER BY projection, entity_type, entity_id, coalesce(event_version, id) DESC, id DESC;

-- +goose Down
DROP INDEX IF EXISTS outbox_events_done_idx;
DROP TABLE IF EXISTS outbox_applied;

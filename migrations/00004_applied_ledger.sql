-- +goose NO TRANSACTION
-- +goose Up
-- The applied-version ledger: per projection and document, the newest
-- version the projection confirmed, and whether it was a delete. The engine
-- forgets a delete's version after index.gc_deletes (60 s) or a restart, so
-- external versioning alone would let a late replay of an older upsert bring
-- a deleted document back; the leader checks this table before sending.
-- +goose StatementBegin
CREATE TABLE IF NOT EXISTS outbox_applied (
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
CREATE INDEX IF NOT EXISTS outbox_applied_deleted_idx ON outbox_applied (applied_at) WHERE deleted;

-- The pruner removes done rows older than the retention, oldest ack first.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_events_done_idx ON outbox_events (processed_at) WHERE status = 'done';

-- What was applied before the ledger existed: the newest done event of each
-- document (version = event_version, or the outbox id when null). In pages
-- of 10 000 outbox ids, one short transaction each, merged into the ledger
-- by (version, id): on an outbox of millions no transaction holds a
-- snapshot or row locks for long, and a rerun after an interruption merges
-- the same pages again to the same result.
-- +wlproj locks ROW EXCLUSIVE on outbox_applied, ACCESS SHARE on outbox_events (writes go on; one short transaction per page)
-- +goose StatementBegin
DO $$
DECLARE
    after bigint := 0;
    upto  bigint;
BEGIN
    LOOP
        SELECT max(id) INTO upto FROM (SELECT id FROM outbox_events WHERE id > after ORDER BY id LIMIT 10000) page;
        EXIT WHEN upto IS NULL;
        INSERT INTO outbox_applied AS a (projection, entity_type, entity_id, version, deleted, event_id, applied_at)
        SELECT DISTINCT ON (projection, entity_type, entity_id)
               projection, entity_type, entity_id, coalesce(event_version, id), op = 'delete', id, coalesce(processed_at, now())
          FROM outbox_events
         WHERE id > after AND id <= upto AND status = 'done'
         ORDER BY projection, entity_type, entity_id, coalesce(event_version, id) DESC, id DESC
        ON CONFLICT (projection, entity_type, entity_id) DO UPDATE
           SET version = excluded.version, deleted = excluded.deleted, event_id = excluded.event_id, applied_at = excluded.applied_at
         WHERE (excluded.version, excluded.event_id) > (a.version, a.event_id);
        after := upto;
        COMMIT;
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS outbox_events_done_idx;
DROP TABLE IF EXISTS outbox_applied;

-- +goose NO TRANSACTION
-- +goose Up
-- discarded: an operator closed a failed row for good (wlproj failed
-- discard). Terminal like failed, and never revived automatically.
-- NOT VALID: the new check only widens the old one, which every existing row
-- passed, so validating would scan the whole table under this migration's
-- exclusive lock to prove nothing; new and updated rows are checked. One
-- statement, so the table is never without a check and a rerun replaces it.
ALTER TABLE outbox_events DROP CONSTRAINT IF EXISTS outbox_events_status_check,
    ADD CONSTRAINT outbox_events_status_check
    CHECK (status IN ('pending', 'processing', 'done', 'failed', 'discarded')) NOT VALID;

-- Archive picks failed and discarded rows by time of failure; failed rows
-- have outbox_events_failed_idx, discarded rows this one.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_events_discarded_idx ON outbox_events (updated_at) WHERE status = 'discarded';

-- One audit table for every operator action on failed rows. Existing rows
-- were replays; the auto-replay budget (replayed_by = 'auto' over the last
-- minute) keeps using outbox_replay_audit_by_time_idx, and only replays are
-- ever written by 'auto'.
ALTER TABLE outbox_replay_audit ADD COLUMN IF NOT EXISTS action text NOT NULL DEFAULT 'replay'
    CONSTRAINT outbox_replay_audit_action_check CHECK (action IN ('replay', 'discard', 'archive', 'restore'));

-- The dead letter: failed and discarded rows moved out of outbox_events by
-- wlproj failed archive, with every column needed to bring them back under
-- the same id (wlproj replay --archived). updated_at is the time of failure.
-- +goose StatementBegin
CREATE TABLE IF NOT EXISTS outbox_dead_letter (
    id               bigint      PRIMARY KEY,
    projection       text        NOT NULL,
    entity_type      text        NOT NULL,
    entity_id        text        NOT NULL,
    op               text        NOT NULL,
    event_version    bigint,
    payload          jsonb       NOT NULL,
    scope_key        text,
    status           text        NOT NULL,
    attempts         integer     NOT NULL,
    error_class      text,
    error_reason     text,
    last_error       text,
    error_history    jsonb       NOT NULL,
    replay_count     integer     NOT NULL,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    archived_at      timestamptz NOT NULL DEFAULT now(),
    archive_audit_id bigint      NOT NULL REFERENCES outbox_replay_audit (id),
    CONSTRAINT outbox_dead_letter_status_check CHECK (status IN ('failed', 'discarded'))
);
-- +goose StatementEnd

-- By document: the ledger pruner keeps a delete's entry while any archived
-- event of the document could still be restored.
CREATE INDEX IF NOT EXISTS outbox_dead_letter_entity_idx ON outbox_dead_letter (projection, entity_type, entity_id);
-- By age, for listings and for pruning the dead letter itself.
CREATE INDEX IF NOT EXISTS outbox_dead_letter_archived_at_idx ON outbox_dead_letter (archived_at);

-- +goose Down
DROP TABLE IF EXISTS outbox_dead_letter;
ALTER TABLE outbox_replay_audit DROP COLUMN IF EXISTS action;
DROP INDEX CONCURRENTLY IF EXISTS outbox_events_discarded_idx;
-- Discarded rows become failed again: the old check does not know them.
UPDATE outbox_events SET status = 'failed' WHERE status = 'discarded';
ALTER TABLE outbox_events DROP CONSTRAINT IF EXISTS outbox_events_status_check,
    ADD CONSTRAINT outbox_events_status_check
    CHECK (status IN ('pending', 'processing', 'done', 'failed'));

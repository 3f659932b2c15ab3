-- +goose Up
-- +goose StatementBegin
CREATE TABLE outbox_events (
    id                    bigserial PRIMARY KEY,
    -- Producers write these columns and nothing else.
    projection            text        NOT NULL DEFAULT 'search',
    entity_type           text        NOT NULL,
    entity_id             text        NOT NULL,
    op                    text        NOT NULL,
    event_version         bigint,
    payload               jsonb       NOT NULL DEFAULT '{}',
    scope_key             text,
    -- The daemon owns the lifecycle columns.
    status                text        NOT NULL DEFAULT 'pending',
    attempts              integer     NOT NULL DEFAULT 0,
    next_retry_at         timestamptz NOT NULL DEFAULT now(),
    locked_by             text,
    lease_until           timestamptz,
    processing_started_at timestamptz,
    claim_token           bigint,
    processed_at          timestamptz,
    error_class           text,
    error_reason          text,
    last_error            text,
    error_history         jsonb       NOT NULL DEFAULT '[]',
    replay_count          integer     NOT NULL DEFAULT 0,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT outbox_events_op_check CHECK (op IN ('upsert', 'delete')),
    CONSTRAINT outbox_events_status_check CHECK (status IN ('pending', 'processing', 'done', 'failed')),
    CONSTRAINT outbox_events_error_class_check CHECK (error_class IS NULL OR error_class IN ('transient', 'deterministic')),
    CONSTRAINT outbox_events_entity_check CHECK (entity_type <> '' AND projection <> '')
);
-- +goose StatementEnd

-- The claim walks pending rows in id order; the partial index stays as small
-- as the backlog, so millions of done rows do not slow it down.
CREATE INDEX outbox_events_pending_idx ON outbox_events (id) INCLUDE (next_retry_at) WHERE status = 'pending';
-- Reclaim of stuck rows and the in-flight gauge.
CREATE INDEX outbox_events_processing_idx ON outbox_events (lease_until) WHERE status = 'processing';
-- Failed triage: by reason and time of failure.
CREATE INDEX outbox_events_failed_idx ON outbox_events (error_reason, updated_at) WHERE status = 'failed';

-- +goose StatementBegin
CREATE TABLE outbox_leader (
    name        text PRIMARY KEY,
    holder      text        NOT NULL,
    epoch       bigint      NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT now()
);
-- +goose StatementEnd

-- +goose StatementBegin
CREATE TABLE outbox_replay_audit (
    id          bigserial PRIMARY KEY,
    replayed_by text        NOT NULL,
    reason      text        NOT NULL,
    replayed_at timestamptz NOT NULL DEFAULT now(),
    selector    jsonb       NOT NULL,
    event_count integer     NOT NULL,
    event_ids   bigint[]    NOT NULL
);
-- +goose StatementEnd

-- Appends entry to a history array and keeps only the newest keep entries.
-- +goose StatementBegin
CREATE FUNCTION outbox_append_error(history jsonb, entry jsonb, keep integer) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN jsonb_array_length(h) <= keep THEN h
        ELSE (SELECT jsonb_agg(e ORDER BY i) FROM jsonb_array_elements(h) WITH ORDINALITY AS t(e, i)
              WHERE i > jsonb_array_length(h) - keep)
        END
    FROM (SELECT coalesce(history, '[]'::jsonb) || jsonb_build_array(entry) AS h) s
$$;
-- +goose StatementEnd

-- One NOTIFY per inserting statement wakes the leader without polling.
-- +goose StatementBegin
CREATE FUNCTION outbox_events_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox_events', '');
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER outbox_events_notify AFTER INSERT ON outbox_events
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_events_notify();

-- +goose Down
DROP TRIGGER IF EXISTS outbox_events_notify ON outbox_events;
DROP FUNCTION IF EXISTS outbox_events_notify();
DROP FUNCTION IF EXISTS outbox_append_error(jsonb, jsonb, integer);
DROP TABLE IF EXISTS outbox_replay_audit;
DROP TABLE IF EXISTS outbox_leader;
DROP TABLE IF EXISTS outbox_events;

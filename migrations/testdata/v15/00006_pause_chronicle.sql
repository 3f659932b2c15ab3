-- +goose Up
-- Per projection, whether an operator paused it (wlproj pause / resume),
-- who, why and when. A projection without a row runs. The claim reads this
-- table on every call, so it stays one row per projection.
-- +goose StatementBegin
CREATE TABLE outbox_projection_state (
    projection text        PRIMARY KEY,
    paused     boolean     NOT NULL,
    changed_by text        NOT NULL,
    why        text        NOT NULL,
    changed_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT outbox_projection_state_projection_check CHECK (projection <> '')
);
-- +goose StatementEnd

-- The chronicle projection: every event appended once, keyed by its outbox
-- id, so a resend after a crash or a replay adds nothing.
-- +goose StatementBegin
CREATE TABLE chronicle_events (
    event_id    bigint      PRIMARY KEY,
    projection  text        NOT NULL,
    entity_type text        NOT NULL,
    entity_id   text        NOT NULL,
    op          text        NOT NULL,
    version     bigint      NOT NULL,
    payload     jsonb       NOT NULL,
    scope_key   text,
    occurred_at timestamptz NOT NULL,
    appended_at timestamptz NOT NULL DEFAULT now()
);
-- +goose StatementEnd

-- A timeline is read per entity, in the order things happened.
CREATE INDEX chronicle_events_entity_idx ON chronicle_events (entity_type, entity_id, occurred_at);

-- Pause and resume are audited next to the other operator actions; rebuild
-- is reserved for wlproj rebuild. The new check only widens the old one.
ALTER TABLE outbox_replay_audit DROP CONSTRAINT outbox_replay_audit_action_check;
ALTER TABLE outbox_replay_audit ADD CONSTRAINT outbox_replay_audit_action_check
    CHECK (action IN ('replay', 'discard', 'archive', 'restore', 'pause', 'resume', 'rebuild'));

-- +goose Down
-- Audit rows are kept: the narrower check applies to new rows only.
ALTER TABLE outbox_replay_audit DROP CONSTRAINT outbox_replay_audit_action_check;
ALTER TABLE outbox_replay_audit ADD CONSTRAINT outbox_replay_audit_action_check
    CHECK (action IN ('replay', 'discard', 'archive', 'restore')) NOT VALID;
DROP TABLE IF EXISTS chronicle_events;
DROP TABLE IF EXISTS outbox_projection_state;

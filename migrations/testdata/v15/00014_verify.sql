-- +goose Up
-- wlproj verify --repair (and the leader's automatic repair of resurrected
-- documents) is audited next to the other operator actions. The new check
-- only widens the old one; the audit table is small, so validating it is
-- quick.
ALTER TABLE outbox_replay_audit DROP CONSTRAINT outbox_replay_audit_action_check;
ALTER TABLE outbox_replay_audit ADD CONSTRAINT outbox_replay_audit_action_check
    CHECK (action IN ('replay', 'discard', 'archive', 'restore', 'pause', 'resume', 'rebuild', 'repair'));

-- The last complete scheduled verify of each projection (OUTBOX_VERIFY_INTERVAL),
-- for the console's overview on every replica: one row per projection,
-- overwritten by each run.
-- +goose StatementBegin
CREATE TABLE outbox_verify_runs (
    projection   text        PRIMARY KEY,
    index_name   text        NOT NULL,
    -- NULL: compared with the applied-version ledger alone.
    source_table text,
    started_at   timestamptz NOT NULL,
    finished_at  timestamptz NOT NULL DEFAULT now(),
    checked      bigint      NOT NULL,
    missing      bigint      NOT NULL,
    stale        bigint      NOT NULL,
    extra        bigint      NOT NULL,
    resurrected  bigint      NOT NULL,
    in_flight    bigint      NOT NULL,
    -- Resurrected documents the automatic repair deleted in this run.
    repaired     bigint      NOT NULL DEFAULT 0,
    -- Kind -> up to 10 document ids.
    samples      jsonb       NOT NULL DEFAULT '{}'
);
-- +goose StatementEnd

-- +goose Down
DROP TABLE IF EXISTS outbox_verify_runs;
-- Audit rows are kept: the narrower check applies to new rows only.
ALTER TABLE outbox_replay_audit DROP CONSTRAINT outbox_replay_audit_action_check;
ALTER TABLE outbox_replay_audit ADD CONSTRAINT outbox_replay_audit_action_check
    CHECK (action IN ('replay', 'discard', 'archive', 'restore', 'pause', 'resume', 'rebuild')) NOT VALID;

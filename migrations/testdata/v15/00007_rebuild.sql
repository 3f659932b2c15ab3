-- +goose Up
-- One row per rebuild of a projection's index (wlproj rebuild). While a row
-- is open, the leader writes every bulk of that projection to its alias and
-- to target_index too (dual-write), and records here when it started: the
-- rebuild loads the source table only after that confirmation, so every
-- event committed after its snapshot reaches the new index by dual-write.
--
--   open ──swap──▶ swapped ──cleanup──▶ cleaned   (old_index deleted)
--     └──abort──▶ aborted ──cleanup──▶ cleaned   (target_index deleted)
-- +goose StatementBegin
CREATE TABLE outbox_rebuilds (
    id              bigserial   PRIMARY KEY,
    projection      text        NOT NULL,
    -- ELASTIC_INDEX: the name readers and the daemon use.
    alias           text        NOT NULL,
    target_index    text        NOT NULL,
    -- What alias named when the rebuild opened: the index it pointed at, or
    -- alias itself when it was a concrete index; NULL when it did not exist.
    old_index       text,
    old_is_concrete boolean     NOT NULL DEFAULT false,
    source_table    text        NOT NULL,
    mode            text        NOT NULL,
    -- sha256 of the --mapping file, NULL when the current index's was copied;
    -- a re-run must give the same file.
    mapping_sha256  text,
    state           text        NOT NULL DEFAULT 'open',
    started_by      text        NOT NULL,
    reason          text        NOT NULL,
    started_at      timestamptz NOT NULL DEFAULT now(),
    -- When a leader first wrote to both indexes; the last leader (worker
    -- id, epoch) that confirmed it does.
    dual_write_at    timestamptz,
    dual_write_by    text,
    dual_write_epoch bigint,
    -- Resume point: every source row up to this key is in target_index.
    loaded_type     text,
    loaded_id       text,
    rows_loaded     bigint      NOT NULL DEFAULT 0,
    rows_refused    bigint      NOT NULL DEFAULT 0,
    rows_superseded bigint      NOT NULL DEFAULT 0,
    -- --emit-outbox: the outbox ids of the first and last event it enqueued.
    emit_first_id   bigint,
    emit_last_id    bigint,
    finished_at     timestamptz,
    cleaned_at      timestamptz,
    CONSTRAINT outbox_rebuilds_state_check CHECK (state IN ('open', 'swapped', 'aborted', 'cleaned')),
    CONSTRAINT outbox_rebuilds_mode_check CHECK (mode IN ('bulk', 'emit-outbox'))
);
-- +goose StatementEnd

-- At most one open rebuild per projection; the leader looks it up by this.
CREATE UNIQUE INDEX outbox_rebuilds_open_idx ON outbox_rebuilds (projection) WHERE state = 'open';

-- +goose Down
DROP TABLE IF EXISTS outbox_rebuilds;

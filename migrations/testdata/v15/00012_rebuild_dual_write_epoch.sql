-- +goose Up
-- A rebuild's dual-write confirmation is keyed to the leader's term: the
-- swap needs a fresh one from the current epoch of dual_write_leader, so a
-- failover to a replica that does not dual-write (another ELASTIC_INDEX, no
-- grant, an older binary) stops the swap instead of passing unnoticed.
--
-- dual_write_since is when the present unbroken run of confirmations began:
-- it moves whenever a leader confirms and the one before it was not the
-- previous term's. load_since is its value when the load took its first
-- snapshot: while the two agree, every event committed since then reached
-- both indexes. After the swap the leader keeps writing the old index too
-- (a rollback then serves current data) until --cleanup releases it;
-- released_at is when the leader was told to stop writing the index that
-- cleanup deletes.
--
--   open ──swap──▶ swapped ──rollback──▶ rolled_back ──cleanup──▶ cleaned
--
-- Nullable columns without defaults and a CHECK on a table of a few rows:
-- nothing is rewritten.
ALTER TABLE outbox_rebuilds
    ADD COLUMN dual_write_leader  text,
    ADD COLUMN dual_write_seen_at timestamptz,
    ADD COLUMN dual_write_since   timestamptz,
    ADD COLUMN load_since         timestamptz,
    ADD COLUMN released_at        timestamptz;

ALTER TABLE outbox_rebuilds DROP CONSTRAINT outbox_rebuilds_state_check;
ALTER TABLE outbox_rebuilds ADD CONSTRAINT outbox_rebuilds_state_check
    CHECK (state IN ('open', 'swapped', 'aborted', 'rolled_back', 'cleaned'));

-- +goose Down
ALTER TABLE outbox_rebuilds DROP CONSTRAINT outbox_rebuilds_state_check;
UPDATE outbox_rebuilds SET state = 'aborted' WHERE state = 'rolled_back';
ALTER TABLE outbox_rebuilds ADD CONSTRAINT outbox_rebuilds_state_check
    CHECK (state IN ('open', 'swapped', 'aborted', 'cleaned'));
ALTER TABLE outbox_rebuilds
    DROP COLUMN IF EXISTS dual_write_leader,
    DROP COLUMN IF EXISTS dual_write_seen_at,
    DROP COLUMN IF EXISTS dual_write_since,
    DROP COLUMN IF EXISTS load_since,
    DROP COLUMN IF EXISTS released_at;

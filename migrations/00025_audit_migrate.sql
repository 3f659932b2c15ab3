-- +goose Up
-- wlproj migrate --down is audited beside the other operator actions
-- (action migrate: who, why, when, from and to which version). NOT VALID:
-- the new check only widens the old one (00023's, which added rebase).
ALTER TABLE outbox_replay_audit DROP CONSTRAINT outbox_replay_audit_action_check,
    ADD CONSTRAINT outbox_replay_audit_action_check
    CHECK (action IN ('replay', 'discard', 'archive', 'restore', 'pause', 'resume', 'rebuild', 'repair', 'rebase', 'migrate')) NOT VALID;

-- +goose Down
-- The wider check stays: the rollback that undoes this migration wrote its
-- audit row first, as every rollback past it does, and those rows keep
-- their action. A binary of before 25 never writes it.
-- +wlproj locks none (nothing to undo)
SELECT 1;

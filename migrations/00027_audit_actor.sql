-- +goose Up
-- Every audit row names its actor in full (who, their roles and scopes, how
-- they signed in, via what) and the request id that the action's log lines
-- and trace carry, so one id finds all three; and the (projection, scope
-- key) pairs of the rows it took, projections[i] beside scope_keys[i] (a
-- NULL scope key: the projection as a whole, as a pause takes it), by which
-- the console shows an operator only the rows of their own scopes. All are
-- nullable: rows of before 27, and of a binary of before 27 on this
-- schema, have none, and only an operator of every scope sees them.
-- Refusals by the policy (refused) and reads of unmasked payloads (unmask)
-- are audited beside the actions. NOT VALID: the check only widens 00025's.
ALTER TABLE outbox_replay_audit ADD COLUMN IF NOT EXISTS actor jsonb,
    ADD COLUMN IF NOT EXISTS request_id text,
    ADD COLUMN IF NOT EXISTS projections text[],
    ADD COLUMN IF NOT EXISTS scope_keys text[];
ALTER TABLE outbox_replay_audit DROP CONSTRAINT outbox_replay_audit_action_check,
    ADD CONSTRAINT outbox_replay_audit_action_check
    CHECK (action IN ('replay', 'discard', 'archive', 'restore', 'pause', 'resume', 'rebuild', 'repair', 'rebase', 'migrate',
                      'unmask', 'refused')) NOT VALID;

-- +goose Down
-- The wider check stays, as after 00025: rows of the new actions keep them.
ALTER TABLE outbox_replay_audit DROP COLUMN IF EXISTS request_id, DROP COLUMN IF EXISTS actor,
    DROP COLUMN IF EXISTS projections, DROP COLUMN IF EXISTS scope_keys;

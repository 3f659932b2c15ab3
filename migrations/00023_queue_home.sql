-- +goose NO TRANSACTION
-- +goose Up
-- A queued row is read by its xid, and a position is a pair of snapshots:
-- both are numbers of one cluster's transaction counter. Two ways they went
-- wrong, fixed here.
--
-- 1. A producer that wrote xid itself: NULL was never read (pending for
-- ever, never in the backlog), a copied value could lie behind the
-- position (done, never sent). The column is wlproj's: a trigger sets it
-- to the inserting transaction's id whatever the producer wrote, on every
-- row inserted queued (the default): only those are read by xid, and the
-- rotation's carrying of pending, failed or done rows between partitions
-- keeps them as they were. pg_dump creates triggers after it loads the
-- data, so a restore keeps the dumped values (the rebase below needs them).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_events_stamp_xid() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'queued' THEN
        NEW.xid := pg_current_xact_id();
    END IF;
    RETURN NEW;
END $$;
-- +goose StatementEnd

-- +wlproj locks SHARE ROW EXCLUSIVE on outbox_events (brief, catalog only: inserts wait for it, reads do not)
CREATE OR REPLACE TRIGGER outbox_events_stamp_xid BEFORE INSERT ON outbox_events
    FOR EACH ROW EXECUTE FUNCTION outbox_events_stamp_xid();

-- The rows a producer already queued with xid NULL were never read: they
-- become pending, which the claim sends (oldest due first).
-- +wlproj locks ROW EXCLUSIVE on outbox_events (the few rows queued with a null xid)
UPDATE outbox_events SET status = 'pending', next_retry_at = now(), updated_at = now()
 WHERE status = 'queued' AND xid IS NULL;

-- 2. A database dumped and restored into another cluster (or copied by
-- logical replication) keeps positions and xids of the old cluster's
-- counter, which the new one's may be far below: every new row would lie
-- behind the positions, done unread. The cluster the positions belong to
-- is recorded here; a replica refuses to lead on a database whose cluster
-- differs (or whose positions lie ahead of its counter) until an operator
-- runs `wlproj queue rebase`, which records the new one.
CREATE TABLE IF NOT EXISTS outbox_queue_home (
    one               boolean     PRIMARY KEY DEFAULT true CHECK (one),
    system_identifier bigint      NOT NULL,
    recorded_xid      xid8        NOT NULL,
    recorded_by       text        NOT NULL,
    recorded_at       timestamptz NOT NULL DEFAULT now()
);

INSERT INTO outbox_queue_home (system_identifier, recorded_xid, recorded_by)
SELECT system_identifier, pg_current_xact_id(), 'migration 00023' FROM pg_control_system()
ON CONFLICT (one) DO NOTHING;

-- The rebase is an operator action: audited beside the others.
-- +wlproj locks ACCESS EXCLUSIVE on outbox_replay_audit (the audit trail, written by operators only; small to validate)
ALTER TABLE outbox_replay_audit DROP CONSTRAINT IF EXISTS outbox_replay_audit_action_check,
    ADD CONSTRAINT outbox_replay_audit_action_check
    CHECK (action IN ('replay', 'discard', 'archive', 'restore', 'pause', 'resume', 'rebuild', 'repair', 'rebase')) NOT VALID;

-- +goose Down
-- The audit's wider check stays: rebase rows keep their action, and a
-- rollback past 00025 writes its own (migrate) row before each step.
-- +wlproj locks none (a table of its own)
DROP TABLE IF EXISTS outbox_queue_home;
-- +wlproj locks SHARE ROW EXCLUSIVE on outbox_events (brief, catalog only)
DROP TRIGGER IF EXISTS outbox_events_stamp_xid ON outbox_events;
DROP FUNCTION IF EXISTS outbox_events_stamp_xid();

-- +goose NO TRANSACTION
-- +goose Up
-- Switch step of the insert-only hot path: new rows are queued, read by
-- position and never updated when they succeed, once a binary that reads
-- them leads. A binary of before 17 claims pending rows only and would
-- leave queued ones waiting, so the default is a function that says
-- 'pending' until such a binary has led: here always, and from 00019 on
-- until outbox_ledger_rotation.log_only, which a binary of 19 or newer sets
-- when it first leads, before it reads a queued row. So `wlproj migrate`
-- to head runs while the previous release drains, and its leader keeps
-- draining every new row until the replicas are restarted (runbook,
-- Upgrade order); a fresh database, where no older binary ran, is switched
-- at once by the migrate that created it.
--
-- The origin every projection's first position starts from is taken before
-- the switch, in a statement of its own: a queued row is inserted after the
-- switch committed, by a transaction that was either in progress when the
-- origin was taken or started after it, so no queued row is visible in the
-- origin. A rerun keeps the older origin, which sees even less.
INSERT INTO outbox_queue_origin (snapshot) VALUES (pg_current_snapshot()) ON CONFLICT (one) DO NOTHING;

-- SECURITY DEFINER and PL/pgSQL, as outbox_events_slot() (00021): a
-- default runs as the inserting role, and the application's needs no
-- grant; PL/pgSQL keeps its plan for the session.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_new_row_status() RETURNS text LANGUAGE plpgsql STABLE SECURITY DEFINER AS $$
BEGIN
    RETURN 'pending';
END
$$;
-- +goose StatementEnd
ALTER TABLE outbox_events ALTER COLUMN status SET DEFAULT outbox_new_row_status();

-- +goose Down
-- Back to claimed rows: new rows are pending again, and the queued ones
-- become what their position says, in pages of 10,000 ids, each its own
-- transaction. Run it with the replicas of this binary still running, then
-- roll the binaries back.
ALTER TABLE outbox_events ALTER COLUMN status SET DEFAULT 'pending';
DROP FUNCTION IF EXISTS outbox_new_row_status();
-- +wlproj locks ROW EXCLUSIVE on outbox_events (one short transaction per page of 10,000 ids)
-- +goose StatementBegin
DO $$
DECLARE
    after bigint := 0;
    upto  bigint;
BEGIN
    LOOP
        SELECT max(id) INTO upto FROM (SELECT id FROM outbox_events WHERE id > after ORDER BY id LIMIT 10000) page;
        EXIT WHEN upto IS NULL;
        UPDATE outbox_events e
           SET status = CASE WHEN s.status = 'done' THEN 'done' ELSE 'pending' END,
               processed_at = CASE WHEN s.status = 'done' THEN now() END,
               next_retry_at = now(), updated_at = now()
          FROM outbox_event_states s
         WHERE s.id = e.id AND e.id > after AND e.id <= upto AND e.status = 'queued';
        after := upto;
        COMMIT;
    END LOOP;
END
$$;
-- +goose StatementEnd

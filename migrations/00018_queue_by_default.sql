-- +goose NO TRANSACTION
-- +goose Up
-- Switch step of the insert-only hot path: new rows are queued, read by
-- position and never updated when they succeed. Run it once every replica
-- runs a binary that reads positions (schema 17 or newer is required by
-- it): a binary of before 17 claims pending rows only and would leave
-- queued ones waiting.
--
-- The origin every projection's first position starts from is taken before
-- the default changes, in a statement of its own: a queued row is inserted
-- after the default's change committed, by a transaction that was either in
-- progress when the origin was taken or started after it, so no queued row
-- is visible in the origin. A rerun keeps the older origin, which sees even
-- less.
INSERT INTO outbox_queue_origin (snapshot) VALUES (pg_current_snapshot()) ON CONFLICT (one) DO NOTHING;
ALTER TABLE outbox_events ALTER COLUMN status SET DEFAULT 'queued';

-- +goose Down
-- Back to claimed rows: new rows are pending again, and the queued ones
-- become what their position says, in pages of 10,000 ids, each its own
-- transaction. Run it with the replicas of this binary still running, then
-- roll the binaries back.
ALTER TABLE outbox_events ALTER COLUMN status SET DEFAULT 'pending';
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

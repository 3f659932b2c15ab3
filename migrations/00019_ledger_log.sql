-- +goose NO TRANSACTION
-- +goose Up
-- The ledger becomes insert-only. outbox_applied took one upsert per
-- applied event: under a held vacuum horizon every upsert walked the dead
-- versions of its document's entry, and Postgres's CPU per event doubled
-- within 20 minutes (issue 33's soak). outbox_ledger takes one insert per
-- applied document instead, and the newest entry of a document, by
-- (version, event_id), is its ledger entry: nothing is ever updated or
-- deleted row by row, so no dead version exists for anyone to walk.
--
-- Space comes back by rotation, as PgQ rotates its event tables: three
-- partitions, one of them current (outbox_ledger_rotation). The leader's
-- pruner opens the oldest again, by TRUNCATE, once its entries are older
-- than the retention, after copying into the current one those of its
-- entries still needed (a tombstone younger than the tombstone retention,
-- a document with an event that could still be sent). TRUNCATE leaves no
-- dead tuple, whatever the horizon.

-- +goose StatementBegin
CREATE TABLE IF NOT EXISTS outbox_ledger_rotation (
    one       boolean     PRIMARY KEY DEFAULT true CHECK (one),
    slot      smallint    NOT NULL DEFAULT 0 CHECK (slot BETWEEN 0 AND 2),
    opened_at timestamptz NOT NULL DEFAULT now(),
    -- Set by the first leader that writes outbox_ledger only: from then on
    -- a binary of before 19, which reads outbox_applied, must not lead
    -- (its writes to outbox_applied are refused, see below).
    log_only  boolean     NOT NULL DEFAULT false
);
-- +goose StatementEnd

INSERT INTO outbox_ledger_rotation DEFAULT VALUES ON CONFLICT (one) DO NOTHING;

-- The partition new entries go to: a column default, so every writer
-- (the leader, an operator's INSERT, a test) follows the rotation. Without
-- the rotation's row (emptied by hand) entries go to 0 rather than fail
-- every ack; the rotation then refuses to run and says why. WHERE one:
-- the row is found by its key, so a caller that turned sequential scans
-- off (the ack does) gets no disabled plan, whose cost would JIT-compile
-- the lookup on every call (15 ms each, measured).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_ledger_slot() RETURNS smallint LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT slot FROM outbox_ledger_rotation WHERE one), 0::smallint)
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE TABLE IF NOT EXISTS outbox_ledger (
    slot        smallint    NOT NULL DEFAULT outbox_ledger_slot(),
    projection  text        NOT NULL,
    entity_type text        NOT NULL,
    entity_id   text        NOT NULL,
    version     bigint      NOT NULL,
    deleted     boolean     NOT NULL,
    event_id    bigint      NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
) PARTITION BY LIST (slot);
-- +goose StatementEnd

CREATE TABLE IF NOT EXISTS outbox_ledger_0 PARTITION OF outbox_ledger FOR VALUES IN (0);
CREATE TABLE IF NOT EXISTS outbox_ledger_1 PARTITION OF outbox_ledger FOR VALUES IN (1);
CREATE TABLE IF NOT EXISTS outbox_ledger_2 PARTITION OF outbox_ledger FOR VALUES IN (2);

-- A document's entry is the first of this index in each partition: one
-- probe per partition, three in all.
CREATE INDEX IF NOT EXISTS outbox_ledger_key_idx
    ON outbox_ledger (projection, entity_type, entity_id, version DESC, event_id DESC);

-- A document's ledger entry, as one row or none. Inlined by the planner
-- where it is called in FROM (a set-returning SQL function of one SELECT),
-- so LATERAL joins probe the index per document.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_ledger_entry(p text, t text, i text) RETURNS SETOF outbox_ledger
LANGUAGE sql STABLE AS $$
    SELECT * FROM outbox_ledger
     WHERE projection = p AND entity_type = t AND entity_id = i
     ORDER BY version DESC, event_id DESC LIMIT 1
$$;
-- +goose StatementEnd

-- Every document's entry, for operators and ad-hoc SQL (runbook): a
-- condition on the key is pushed down into it, a join on it is not (use
-- outbox_ledger_entry in a LATERAL join for that).
-- +wlproj locks none (catalog only: a view over a new table)
-- +goose StatementBegin
CREATE OR REPLACE VIEW outbox_ledger_entries AS
SELECT DISTINCT ON (projection, entity_type, entity_id)
       projection, entity_type, entity_id, version, deleted, event_id, applied_at
  FROM outbox_ledger
 ORDER BY projection, entity_type, entity_id, version DESC, event_id DESC;
-- +goose StatementEnd

-- A binary of before 19 still writes outbox_applied during the rolling
-- restart: each of its writes is copied into outbox_ledger, so the binary
-- that leads next judges by it. Once a binary of 19 has led (log_only),
-- outbox_applied no longer holds what was applied, and a binary that reads
-- it must not lead: its writes fail, so its acks fail and its events are
-- sent again later, by a binary that reads the ledger, instead of being
-- judged by a stale entry. WHERE one, as outbox_ledger_slot(): the older
-- binary's ack runs with sequential scans off and JIT on, and without the
-- key the disabled plan's cost JIT-compiled this lookup for every row it
-- acked (500-event batches took 5 to 7 s instead of 50 ms, and its lag
-- grew by a minute during the upgrade test).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_applied_to_ledger() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT log_only FROM outbox_ledger_rotation WHERE one) THEN
        RAISE EXCEPTION 'outbox_applied is read by binaries of before schema 19 only, and a binary of 19 has led: upgrade this replica'
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    INSERT INTO outbox_ledger (projection, entity_type, entity_id, version, deleted, event_id, applied_at)
    VALUES (NEW.projection, NEW.entity_type, NEW.entity_id, NEW.version, NEW.deleted, NEW.event_id, NEW.applied_at);
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE TRIGGER outbox_applied_to_ledger AFTER INSERT OR UPDATE ON outbox_applied
    FOR EACH ROW EXECUTE FUNCTION outbox_applied_to_ledger();
-- +goose StatementEnd

-- New rows are queued once a binary of 19 has led (00018): it takes the
-- ledger (log_only) before it reads a queued row, so until then a binary of
-- before 17, which claims pending rows only, still sees every new row.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_new_row_status() RETURNS text LANGUAGE plpgsql STABLE SECURITY DEFINER AS $$
BEGIN
    IF coalesce((SELECT r.log_only FROM public.outbox_ledger_rotation r WHERE r.one), false) THEN
        RETURN 'queued';
    END IF;
    RETURN 'pending';
END
$$;
-- +goose StatementEnd

-- What outbox_applied holds, copied in pages of 10,000 documents, one short
-- transaction each (the trigger already copies what is written meanwhile;
-- a copy twice is the same entry twice). A rerun copies again: harmless.
-- +wlproj locks ROW EXCLUSIVE on outbox_ledger, ACCESS SHARE on outbox_applied (one short transaction per page)
-- +goose StatementBegin
DO $$
DECLARE
    k record;
    page_end record;
BEGIN
    SELECT '' AS projection, '' AS entity_type, '' AS entity_id INTO k;
    LOOP
        WITH page AS (
            SELECT * FROM outbox_applied a
             WHERE (a.projection, a.entity_type, a.entity_id) > (k.projection, k.entity_type, k.entity_id)
             ORDER BY a.projection, a.entity_type, a.entity_id LIMIT 10000),
        copied AS (
            INSERT INTO outbox_ledger (projection, entity_type, entity_id, version, deleted, event_id, applied_at)
            SELECT projection, entity_type, entity_id, version, deleted, event_id, applied_at FROM page)
        SELECT projection, entity_type, entity_id INTO page_end FROM page
         ORDER BY projection DESC, entity_type DESC, entity_id DESC LIMIT 1;
        EXIT WHEN NOT FOUND;
        k := page_end;
        COMMIT;
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- Back to outbox_applied: every document's newest entry is merged into it,
-- never backwards, then the ledger goes. Run it with the replicas of this
-- binary stopped or still running, then roll the binaries back.
-- New rows are pending from here on, for the binary of before 19 that
-- follows (00018 turns the queued ones into what their position says).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_new_row_status() RETURNS text LANGUAGE plpgsql STABLE SECURITY DEFINER AS $$
BEGIN
    RETURN 'pending';
END
$$;
-- +goose StatementEnd
-- +wlproj locks ACCESS EXCLUSIVE on outbox_applied (brief, catalog only)
DROP TRIGGER IF EXISTS outbox_applied_to_ledger ON outbox_applied;
-- +wlproj locks ROW EXCLUSIVE on outbox_applied (one statement over every document's entry)
-- +goose StatementBegin
INSERT INTO outbox_applied AS a (projection, entity_type, entity_id, version, deleted, event_id, applied_at)
SELECT projection, entity_type, entity_id, version, deleted, event_id, applied_at FROM outbox_ledger_entries
ON CONFLICT (projection, entity_type, entity_id) DO UPDATE
   SET version = excluded.version, deleted = excluded.deleted, event_id = excluded.event_id,
       applied_at = excluded.applied_at
 WHERE (excluded.version, excluded.event_id) > (a.version, a.event_id);
-- +goose StatementEnd
DROP FUNCTION IF EXISTS outbox_applied_to_ledger();
DROP VIEW IF EXISTS outbox_ledger_entries;
DROP FUNCTION IF EXISTS outbox_ledger_entry(text, text, text);
DROP TABLE IF EXISTS outbox_ledger;
DROP FUNCTION IF EXISTS outbox_ledger_slot();
DROP TABLE IF EXISTS outbox_ledger_rotation;

-- +goose NO TRANSACTION
-- +goose Up
-- outbox_events becomes a table partitioned by LIST (slot), rotated as the
-- ledger is (00019): three partitions, one of them current
-- (outbox_events_rotation), and the leader's pruner opens the oldest again
-- by TRUNCATE once every projection has passed its rows and they are older
-- than the retention, after moving into the current one the rows still
-- needed (retrying, failed, discarded, done within the retention). Before,
-- every event was deleted row by row after the retention: one dead tuple
-- per event, which a held vacuum horizon kept for everyone to walk.
--
-- Online, with producers writing throughout: the table as it is becomes
-- partition 0 (outbox_events_0) of a new parent that takes its name, in one
-- short transaction, under the runner's lock_timeout (retried; producers
-- wait at most that long). Its rows are not copied: a CHECK (slot = 0),
-- validated beforehand without blocking writes, lets ATTACH skip the scan,
-- and its indexes become the parent's indexes' partitions as they are.
-- New rows go to partition 1. Producers keep INSERT INTO outbox_events.

-- What the swap cannot carry over to the new parent is refused before
-- anything changes, by name: a trigger, rule or policy of the table's own
-- would no longer see new rows, a foreign key to it would reject them, a
-- publication (change data capture) would stop seeing them.
-- +wlproj locks none (catalog only: reads the catalog)
-- +goose StatementBegin
DO $$
DECLARE
    found text;
BEGIN
    IF to_regclass('outbox_events_0') IS NOT NULL THEN
        RETURN;
    END IF;
    SELECT string_agg(what, '; ') INTO found FROM (
        SELECT 'trigger ' || tgname AS what FROM pg_trigger
         WHERE tgrelid = 'outbox_events'::regclass AND NOT tgisinternal AND tgname <> 'outbox_events_notify'
        UNION ALL
        SELECT 'foreign key ' || conname || ' of ' || conrelid::regclass FROM pg_constraint
         WHERE confrelid = 'outbox_events'::regclass AND contype = 'f'
        UNION ALL
        SELECT 'publication ' || pubname FROM pg_publication_tables
         WHERE schemaname = 'public' AND tablename = 'outbox_events'
        UNION ALL
        SELECT 'publication ' || pubname || ' (all tables)' FROM pg_publication WHERE puballtables
        UNION ALL
        SELECT 'rule ' || rulename FROM pg_rules WHERE schemaname = 'public' AND tablename = 'outbox_events'
        UNION ALL
        SELECT 'row-level security' FROM pg_class WHERE oid = 'outbox_events'::regclass AND relrowsecurity) w;
    IF found IS NOT NULL THEN
        RAISE EXCEPTION 'migration 00021 cannot partition outbox_events: it has % of its own, which would not follow its new rows', found
            USING HINT = 'drop it (or move it to the application''s tables), migrate, and create it again on outbox_events; see runbook.md, "The outbox''s partitions (00021)"';
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE TABLE IF NOT EXISTS outbox_events_rotation (
    one       boolean     PRIMARY KEY DEFAULT true CHECK (one),
    slot      smallint    NOT NULL DEFAULT 1 CHECK (slot BETWEEN 0 AND 2),
    opened_at timestamptz NOT NULL DEFAULT now()
);
-- +goose StatementEnd

INSERT INTO outbox_events_rotation DEFAULT VALUES ON CONFLICT (one) DO NOTHING;

-- The partition a new row goes to: the parent's column default, so every
-- writer (the application, the daemon, an operator) follows the rotation.
-- Read by its key, once per row. Without the row (emptied by hand) rows go
-- to 1 rather than fail; the rotation then refuses to run and says why.
-- SECURITY DEFINER: a default runs as the inserting role, and the
-- application's needs no grant on the rotation's table. PL/pgSQL, whose
-- plan a session keeps: a SQL function here is planned again by every
-- INSERT statement, 25 us more per single-row insert (pgbench), where this
-- one measured as a constant default within noise. No SET search_path
-- (it costs as much again per call): the body names its one table with its
-- schema and calls no operator or function a search path could redirect.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_events_slot() RETURNS smallint LANGUAGE plpgsql STABLE SECURITY DEFINER AS $$
BEGIN
    RETURN coalesce((SELECT r.slot FROM public.outbox_events_rotation r WHERE r.one), 1::smallint);
END
$$;
-- +goose StatementEnd

-- The column ATTACH needs, constant on the existing rows: no rewrite.
-- +wlproj locks ACCESS EXCLUSIVE on outbox_events (brief, catalog only; none once it is partitioned)
-- +goose StatementBegin
DO $$
BEGIN
    IF to_regclass('outbox_events_0') IS NULL THEN
        ALTER TABLE outbox_events ADD COLUMN IF NOT EXISTS slot smallint NOT NULL DEFAULT 0;
        IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'outbox_events_0_slot_check') THEN
            ALTER TABLE outbox_events ADD CONSTRAINT outbox_events_0_slot_check CHECK (slot = 0) NOT VALID;
        END IF;
    END IF;
END
$$;
-- +goose StatementEnd

-- The scans that let ATTACH skip its own under an ACCESS EXCLUSIVE lock:
-- the slot's CHECK, and the status CHECK 00017 left NOT VALID (the
-- parent's constraints must hold, validated, on each partition).
-- +wlproj locks SHARE UPDATE EXCLUSIVE on outbox_events (one scan; writes go on)
-- +goose StatementBegin
DO $$
BEGIN
    IF to_regclass('outbox_events_0') IS NULL THEN
        ALTER TABLE outbox_events VALIDATE CONSTRAINT outbox_events_0_slot_check;
        ALTER TABLE outbox_events VALIDATE CONSTRAINT outbox_events_status_check;
    END IF;
END
$$;
-- +goose StatementEnd

-- The new parent, with its partitions 1 and 2 and its indexes, under a
-- name of its own until the swap.
-- +wlproj locks ACCESS SHARE on outbox_events (read as the template of the new parent)
-- +goose StatementBegin
DO $$
DECLARE
    ix record;
BEGIN
    IF to_regclass('outbox_events_0') IS NOT NULL OR to_regclass('outbox_events_parted') IS NOT NULL THEN
        RETURN;
    END IF;
    CREATE TABLE outbox_events_parted (LIKE outbox_events INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE)
        PARTITION BY LIST (slot);
    ALTER TABLE outbox_events_parted DROP CONSTRAINT IF EXISTS outbox_events_0_slot_check;
    ALTER TABLE outbox_events_parted ALTER COLUMN slot SET DEFAULT outbox_events_slot();
    CREATE TABLE outbox_events_1 PARTITION OF outbox_events_parted FOR VALUES IN (1) WITH (toast_tuple_target = 128);
    CREATE TABLE outbox_events_2 PARTITION OF outbox_events_parted FOR VALUES IN (2) WITH (toast_tuple_target = 128);
    -- Each index of the table, on the parent: ATTACH finds the table's own
    -- as their partitions. The primary key stays partition 0's: a unique
    -- index of the parent would need the slot in it; ids come from one
    -- sequence, and each partition has its own unique index on id.
    FOR ix IN SELECT c.relname, pg_get_indexdef(i.indexrelid) AS def
                FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
               WHERE i.indrelid = 'outbox_events'::regclass AND NOT i.indisprimary LOOP
        EXECUTE replace(ix.def, 'INDEX ' || ix.relname || ' ON public.outbox_events ',
                        'INDEX parted_' || ix.relname || ' ON public.outbox_events_parted ');
    END LOOP;
    -- Each partition's index named after its parent's: outbox_events_1_queued_idx.
    FOR ix IN SELECT c.relname AS child, p.relname AS parent, t.relname AS tbl
                FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid JOIN pg_class p ON p.oid = h.inhparent
                JOIN pg_index i ON i.indexrelid = c.oid JOIN pg_class t ON t.oid = i.indrelid
               WHERE p.relname LIKE 'parted\_%' AND p.relkind = 'I' LOOP
        EXECUTE format('ALTER INDEX %I RENAME TO %I', ix.child,
                       replace(substr(ix.parent, length('parted_') + 1), 'outbox_events_', ix.tbl || '_'));
    END LOOP;
    CREATE UNIQUE INDEX outbox_events_1_pkey ON outbox_events_1 (id);
    CREATE UNIQUE INDEX outbox_events_2_pkey ON outbox_events_2 (id);
    CREATE TRIGGER outbox_events_notify_parted AFTER INSERT ON outbox_events_parted
        FOR EACH STATEMENT EXECUTE FUNCTION outbox_events_notify();
END
$$;
-- +goose StatementEnd

-- The swap, in one transaction: the table becomes partition 0, the parent
-- takes its name, its indexes' and its trigger's; the views over the table
-- are defined again over the parent (a view is bound to the table it was
-- created on, not to its name); the parent gets the table's owner and
-- grants, column grants included.
-- +wlproj locks ACCESS EXCLUSIVE on outbox_events (brief, catalog only: renames and an ATTACH whose scan the CHECK spares)
-- +goose StatementBegin
DO $$
DECLARE
    v record;
    ix record;
    g record;
    owner name;
    views text[] := '{}';
    defs text[] := '{}';
BEGIN
    IF to_regclass('outbox_events_0') IS NOT NULL THEN
        RETURN;
    END IF;
    LOCK TABLE outbox_events IN ACCESS EXCLUSIVE MODE;
    FOR v IN SELECT DISTINCT c.oid::regclass::text AS name, pg_get_viewdef(c.oid) AS def
               FROM pg_depend d JOIN pg_rewrite r ON r.oid = d.objid JOIN pg_class c ON c.oid = r.ev_class
              WHERE d.refobjid = 'outbox_events'::regclass AND c.relkind = 'v' LOOP
        views := views || v.name;
        defs := defs || v.def;
    END LOOP;
    ALTER TABLE outbox_events RENAME TO outbox_events_0;
    FOR ix IN SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
               WHERE i.indrelid = 'outbox_events_0'::regclass LOOP
        EXECUTE format('ALTER INDEX %I RENAME TO %I', ix.relname, replace(ix.relname, 'outbox_events_', 'outbox_events_0_'));
        IF to_regclass('parted_' || ix.relname) IS NOT NULL THEN
            EXECUTE format('ALTER INDEX %I RENAME TO %I', 'parted_' || ix.relname, ix.relname);
        END IF;
    END LOOP;
    DROP TRIGGER outbox_events_notify ON outbox_events_0;
    ALTER TABLE outbox_events_parted RENAME TO outbox_events;
    ALTER TRIGGER outbox_events_notify_parted ON outbox_events RENAME TO outbox_events_notify;
    ALTER TABLE outbox_events ATTACH PARTITION outbox_events_0 FOR VALUES IN (0);
    FOR i IN 1 .. coalesce(array_length(views, 1), 0) LOOP
        EXECUTE format('CREATE OR REPLACE VIEW %s AS %s', views[i], defs[i]);
    END LOOP;
    SELECT pg_get_userbyid(relowner) INTO owner FROM pg_class WHERE oid = 'outbox_events_0'::regclass;
    EXECUTE format('ALTER TABLE outbox_events OWNER TO %I', owner);
    EXECUTE format('ALTER TABLE outbox_events_1 OWNER TO %I', owner);
    EXECUTE format('ALTER TABLE outbox_events_2 OWNER TO %I', owner);
    ALTER SEQUENCE outbox_events_id_seq OWNED BY outbox_events.id;
    FOR g IN SELECT NULL::name AS col, a.privilege_type, a.grantee
               FROM pg_class c, aclexplode(c.relacl) a
              WHERE c.oid = 'outbox_events_0'::regclass AND a.grantee <> c.relowner
             UNION ALL
             SELECT t.attname, a.privilege_type, a.grantee
               FROM pg_attribute t, aclexplode(t.attacl) a
              WHERE t.attrelid = 'outbox_events_0'::regclass AND t.attacl IS NOT NULL LOOP
        EXECUTE format('GRANT %s %s ON outbox_events TO %s', g.privilege_type,
                       CASE WHEN g.col IS NULL THEN '' ELSE format('(%I)', g.col) END,
                       CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(g.grantee)) END);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- Back to one table: partition 0 becomes outbox_events again, with the rows
-- of partitions 1 and 2 moved into it, in one transaction under ACCESS
-- EXCLUSIVE: no statement can change a row while it moves. Producers wait
-- for the copy (about a second per 100,000 rows): run it at a quiet time.
-- +wlproj locks ACCESS EXCLUSIVE on outbox_events (for the copy of partitions 1 and 2)
-- +goose StatementBegin
DO $$
DECLARE
    v record;
    ix record;
    views text[] := '{}';
    defs text[] := '{}';
BEGIN
    IF to_regclass('outbox_events_0') IS NULL THEN
        RETURN;
    END IF;
    LOCK TABLE outbox_events IN ACCESS EXCLUSIVE MODE;
    FOR v IN SELECT DISTINCT c.oid::regclass::text AS name, pg_get_viewdef(c.oid) AS def
               FROM pg_depend d JOIN pg_rewrite r ON r.oid = d.objid JOIN pg_class c ON c.oid = r.ev_class
              WHERE d.refobjid = 'outbox_events'::regclass AND c.relkind = 'v' LOOP
        views := views || v.name;
        defs := defs || v.def;
    END LOOP;
    UPDATE outbox_events SET slot = 0 WHERE slot <> 0;
    ALTER TABLE outbox_events DETACH PARTITION outbox_events_0;
    ALTER TABLE outbox_events RENAME TO outbox_events_parted;
    ALTER TABLE outbox_events_0 RENAME TO outbox_events;
    FOR i IN 1 .. coalesce(array_length(views, 1), 0) LOOP
        EXECUTE format('CREATE OR REPLACE VIEW %s AS %s', views[i], defs[i]);
    END LOOP;
    ALTER SEQUENCE outbox_events_id_seq OWNED BY outbox_events.id;
    DROP TABLE outbox_events_parted;
    FOR ix IN SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
               WHERE i.indrelid = 'outbox_events'::regclass LOOP
        EXECUTE format('ALTER INDEX %I RENAME TO %I', ix.relname, replace(ix.relname, 'outbox_events_0_', 'outbox_events_'));
    END LOOP;
    CREATE TRIGGER outbox_events_notify AFTER INSERT ON outbox_events
        FOR EACH STATEMENT EXECUTE FUNCTION outbox_events_notify();
    ALTER TABLE outbox_events DROP COLUMN slot;
END
$$;
-- +goose StatementEnd
DROP FUNCTION IF EXISTS outbox_events_slot();
DROP TABLE IF EXISTS outbox_events_rotation;

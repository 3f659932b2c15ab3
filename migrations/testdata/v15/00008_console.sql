-- +goose Up
-- The operator console pages failed rows newest failure first, by keyset
-- on (updated_at, id): this index makes its first screen and every later
-- page an index scan of one page's rows, where outbox_events_failed_idx
-- (reason first) would sort every failed row.
CREATE INDEX outbox_events_failed_time_idx ON outbox_events (updated_at, id) WHERE status = 'failed';

-- "Last error contains": a trigram index on the failed rows' last error,
-- so the search reads the few matching rows, not every failed one. pg_trgm
-- ships with Postgres (contrib) and is a trusted extension; where it is
-- missing or the migrating role may not create it, the search still works,
-- by a scan of the failed rows, and the migration says so.
-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'pg_trgm') THEN
        RAISE NOTICE 'pg_trgm is not available: the console''s last-error search scans the failed rows';
        RETURN;
    END IF;
    CREATE EXTENSION IF NOT EXISTS pg_trgm;
    CREATE INDEX outbox_events_failed_error_idx ON outbox_events
        USING gin (lower(last_error) gin_trgm_ops) WHERE status = 'failed';
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'may not create pg_trgm: the console''s last-error search scans the failed rows';
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP INDEX IF EXISTS outbox_events_failed_error_idx;
DROP INDEX IF EXISTS outbox_events_failed_time_idx;

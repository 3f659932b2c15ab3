-- +goose NO TRANSACTION
-- +goose Up
-- Expand step of the insert-only hot path. Nothing here changes what
-- producers write or what a running binary reads: rows stay 'pending'
-- until 00018 makes 'queued' the default, so a binary of before this file
-- keeps draining while the replicas are restarted onto one that reads
-- positions.
--
-- queued: a row the leader reads by position instead of claiming it. A
-- queued row is never updated when it succeeds: it is done once its
-- projection's position (outbox_positions) is past it. Only a row that
-- fails, is paused behind, or is replayed gets per-row state again, as
-- 'pending' or 'failed'. NOT VALID: the new check only widens the old one.
ALTER TABLE outbox_events DROP CONSTRAINT IF EXISTS outbox_events_status_check,
    ADD CONSTRAINT outbox_events_status_check
    CHECK (status IN ('queued', 'pending', 'processing', 'done', 'failed', 'discarded')) NOT VALID;

-- The producer's top-level transaction id, which places the row between two
-- snapshots of the leader: a transaction that commits after a later one is
-- read in the batch of the snapshot that first sees it committed, never
-- skipped (PgQ's batches). Nullable, the default applies to new rows only:
-- adding it changes the catalog, nothing is rewritten; rows from before it
-- are never queued.
ALTER TABLE outbox_events ADD COLUMN IF NOT EXISTS xid xid8;
ALTER TABLE outbox_events ALTER COLUMN xid SET DEFAULT pg_current_xact_id();

-- The position read: each projection's queued rows in (xid, id) order. A
-- queued row that succeeds is never updated, so its entry never dies; one
-- that fails leaves the index with its status.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_events_queued_idx ON outbox_events (projection, xid, id) WHERE status = 'queued';

-- Where each projection's leader is. A position is (prev, cur, xid, id):
-- every queued row visible in snapshot prev, and those visible in cur but
-- not in prev up to (xid, id), are behind it. done is what the leader
-- confirmed; claimed what it read and has in flight (its lease and owner
-- are the in-flight batch's, at batch level). Written at most once a second
-- per projection, whatever the rate: a restarted leader sends again what
-- the last second confirmed, and the engine's external versions make that
-- a no-op.
-- +goose StatementBegin
CREATE TABLE IF NOT EXISTS outbox_positions (
    projection            text        PRIMARY KEY,
    done_prev             pg_snapshot NOT NULL,
    done_cur              pg_snapshot NOT NULL,
    done_xid              xid8        NOT NULL DEFAULT '0',
    done_id               bigint      NOT NULL DEFAULT 0,
    claimed_prev          pg_snapshot NOT NULL,
    claimed_cur           pg_snapshot NOT NULL,
    claimed_xid           xid8        NOT NULL DEFAULT '0',
    claimed_id            bigint      NOT NULL DEFAULT 0,
    locked_by             text,
    epoch                 bigint,
    lease_until           timestamptz,
    processing_started_at timestamptz,
    -- Events confirmed in all, the last checkpoint that confirmed any, and
    -- which leader saved the position last.
    done_events           bigint      NOT NULL DEFAULT 0,
    confirmed_at          timestamptz,
    saved_by              text,
    updated_at            timestamptz NOT NULL DEFAULT now()
);
-- +goose StatementEnd

-- The snapshot the first position of every projection starts from: taken
-- by 00018 in the transaction that makes 'queued' the default, so no queued
-- row is visible in it. One row.
-- +goose StatementBegin
CREATE TABLE IF NOT EXISTS outbox_queue_origin (
    one      boolean     PRIMARY KEY DEFAULT true CHECK (one),
    snapshot pg_snapshot NOT NULL,
    since    timestamptz NOT NULL DEFAULT now()
);
-- +goose StatementEnd

-- Queued rows leave no processed_at to count acks by: each checkpoint adds
-- what it confirmed to its minute, for the console's activity chart. One
-- row per projection and minute, pruned with the done rows.
-- +goose StatementBegin
CREATE TABLE IF NOT EXISTS outbox_done_by_minute (
    minute     timestamptz NOT NULL,
    projection text        NOT NULL,
    done       bigint      NOT NULL,
    PRIMARY KEY (minute, projection)
);
-- +goose StatementEnd

-- Whether a queued row (xid, id) is behind the position (prev, cur, pxid,
-- pid). The one definition of done and processing for queued rows: the
-- leader's read, outbox_event_states and every status count use it.
-- +wlproj locks none on outbox_events (catalog only: a view or function over it)
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_behind(xid xid8, id bigint, prev pg_snapshot, cur pg_snapshot, pxid xid8, pid bigint)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT pg_visible_in_snapshot(xid, prev)
        OR (pg_visible_in_snapshot(xid, cur) AND (xid, id) <= (pxid, pid))
$$;
-- +goose StatementEnd

-- The operator's view of every row: outbox_events as it reads without
-- queued rows, every column the same except that a queued row's status is
-- what its position says (pending, processing or done), with the lease,
-- owner and epoch of its batch while it is in flight. queued tells the two
-- kinds apart. Status counts, doc, the console, the tests' checks and the
-- runbook's SQL read this.
-- +wlproj locks none on outbox_events (catalog only: a view or function over it)
-- +goose StatementBegin
CREATE OR REPLACE VIEW outbox_event_states AS
SELECT e.id, e.projection, e.entity_type, e.entity_id, e.op, e.event_version, e.payload, e.scope_key,
       s.status, e.attempts, e.next_retry_at,
       CASE WHEN q THEN CASE WHEN s.status = 'processing' THEN p.locked_by END ELSE e.locked_by END AS locked_by,
       CASE WHEN q THEN CASE WHEN s.status = 'processing' THEN p.lease_until END ELSE e.lease_until END AS lease_until,
       CASE WHEN q THEN CASE WHEN s.status = 'processing' THEN p.processing_started_at END
            ELSE e.processing_started_at END AS processing_started_at,
       CASE WHEN q THEN CASE WHEN s.status = 'processing' THEN p.epoch END ELSE e.claim_token END AS claim_token,
       e.processed_at, e.error_class, e.error_reason, e.last_error, e.error_history, e.replay_count,
       e.created_at, e.updated_at, e.claim_seq, e.repair, e.traceparent, q AS queued, e.xid
  FROM outbox_events e
  LEFT JOIN outbox_positions p ON e.status = 'queued' AND p.projection = e.projection
 CROSS JOIN LATERAL (SELECT e.status = 'queued' AS q) k
 CROSS JOIN LATERAL (SELECT CASE
            WHEN NOT q THEN e.status
            WHEN p.projection IS NULL THEN 'pending'
            WHEN outbox_behind(e.xid, e.id, p.done_prev, p.done_cur, p.done_xid, p.done_id) THEN 'done'
            WHEN outbox_behind(e.xid, e.id, p.claimed_prev, p.claimed_cur, p.claimed_xid, p.claimed_id) THEN 'processing'
            ELSE 'pending' END AS status) s;
-- +goose StatementEnd

-- Each projection that has queued rows, with its confirmed and claimed
-- positions (the origin for one no leader has saved yet): one probe of
-- outbox_events_queued_idx per projection.
-- +wlproj locks none on outbox_events (catalog only: a view or function over it)
-- +goose StatementBegin
CREATE OR REPLACE VIEW outbox_queue_heads AS
WITH RECURSIVE names AS (
    (SELECT projection FROM outbox_events WHERE status = 'queued' ORDER BY projection LIMIT 1)
  UNION ALL
    SELECT (SELECT n.projection FROM outbox_events n WHERE n.status = 'queued' AND n.projection > names.projection
             ORDER BY n.projection LIMIT 1)
      FROM names WHERE names.projection IS NOT NULL)
SELECT n.projection,
       coalesce(p.done_prev, o.snapshot) AS done_prev, coalesce(p.done_cur, o.snapshot) AS done_cur,
       coalesce(p.done_xid, '0') AS done_xid, coalesce(p.done_id, 0) AS done_id,
       coalesce(p.claimed_prev, o.snapshot) AS claimed_prev, coalesce(p.claimed_cur, o.snapshot) AS claimed_cur,
       coalesce(p.claimed_xid, '0') AS claimed_xid, coalesce(p.claimed_id, 0) AS claimed_id,
       p.locked_by, p.lease_until, p.processing_started_at
  FROM names n
 CROSS JOIN outbox_queue_origin o
  LEFT JOIN outbox_positions p ON p.projection = n.projection
 WHERE n.projection IS NOT NULL;
-- +goose StatementEnd

-- The queued rows not done yet, pending or in flight, in three index
-- walks that each cost what they return: those of transactions in progress
-- at the position's first snapshot (one probe per such transaction), those
-- past the position in (xid, id) order, and those behind it of
-- transactions in progress at its second snapshot. A count costs what the
-- backlog is, never the history, nor the part of the batch already done.
-- A function, so that its plan is kept to the index whatever the
-- statistics say (a freshly emptied outbox, a positions table never
-- analyzed) and never JIT-compiled: its SET clauses hold while it runs. It
-- stops after max_rows rows (NULL: all), which the gauges use to bound
-- their cost.
-- +wlproj locks none on outbox_events (catalog only: a view or function over it)
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_queue_backlog_rows(max_rows bigint DEFAULT NULL)
RETURNS TABLE (projection text, id bigint, xid xid8, created_at timestamptz, entity_type text, entity_id text,
               in_flight boolean, locked_by text, lease_until timestamptz, processing_started_at timestamptz)
LANGUAGE sql STABLE
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_hashjoin = off SET jit = off AS $$
SELECT h.projection, e.id, e.xid, e.created_at, e.entity_type, e.entity_id,
       outbox_behind(e.xid, e.id, h.claimed_prev, h.claimed_cur, h.claimed_xid, h.claimed_id) AS in_flight,
       h.locked_by, h.lease_until, h.processing_started_at
  FROM outbox_queue_heads h
 CROSS JOIN LATERAL (
    SELECT q.id, q.xid, q.created_at, q.entity_type, q.entity_id FROM outbox_events q
     WHERE q.status = 'queued' AND q.projection = h.projection
       AND q.xid = ANY(ARRAY(SELECT pg_snapshot_xip(h.done_prev)))
  UNION ALL
    SELECT q.id, q.xid, q.created_at, q.entity_type, q.entity_id FROM outbox_events q
     WHERE q.status = 'queued' AND q.projection = h.projection AND q.xid >= pg_snapshot_xmax(h.done_prev)
       AND (q.xid, q.id) > (h.done_xid, h.done_id)
  UNION ALL
    SELECT q.id, q.xid, q.created_at, q.entity_type, q.entity_id FROM outbox_events q
     WHERE q.status = 'queued' AND q.projection = h.projection
       AND q.xid = ANY(ARRAY(SELECT x FROM pg_snapshot_xip(h.done_cur) x WHERE x >= pg_snapshot_xmax(h.done_prev)))
       AND (q.xid, q.id) <= (h.done_xid, h.done_id)) e
 WHERE NOT outbox_behind(e.xid, e.id, h.done_prev, h.done_cur, h.done_xid, h.done_id)
 LIMIT max_rows
$$;
-- +goose StatementEnd

-- +wlproj locks none on outbox_events (catalog only: a view or function over it)
-- +goose StatementBegin
CREATE OR REPLACE VIEW outbox_queue_backlog AS SELECT * FROM outbox_queue_backlog_rows();
-- +goose StatementEnd

-- +goose Down
DROP VIEW IF EXISTS outbox_queue_backlog;
DROP FUNCTION IF EXISTS outbox_queue_backlog_rows(bigint);
DROP VIEW IF EXISTS outbox_queue_heads;
DROP VIEW IF EXISTS outbox_event_states;
DROP FUNCTION IF EXISTS outbox_behind(xid8, bigint, pg_snapshot, pg_snapshot, xid8, bigint);
DROP TABLE IF EXISTS outbox_done_by_minute;
DROP TABLE IF EXISTS outbox_queue_origin;
DROP TABLE IF EXISTS outbox_positions;
DROP INDEX CONCURRENTLY IF EXISTS outbox_events_queued_idx;
ALTER TABLE outbox_events ALTER COLUMN xid DROP DEFAULT;
ALTER TABLE outbox_events DROP COLUMN IF EXISTS xid;

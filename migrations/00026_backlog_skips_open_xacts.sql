-- +goose NO TRANSACTION
-- +goose Up
-- The backlog no longer walks the rows of transactions still in progress.
-- Their rows are in outbox_events_queued_idx from their insert on, and each
-- index entry cost a heap visit to find it invisible: one open producer
-- transaction of 200k rows made every gauge read walk them (the gauges'
-- statement 174 to 5,008 buffers, 3 to 23 ms, the console's overview 18 to
-- 80 ms beside 1 M queued rows; TestBacklogFiguresAtScale).
-- The statement's own snapshot says which transactions it cannot see
-- (those in progress, its xip list, and every one from its xmax on): the
-- walk past the position is split around them, one index range per gap,
-- and the probes of late transactions leave them out. The same rows, the
-- same columns: a binary of 21 reads it as before, so RequiredVersion
-- stays.
--
-- ranges: the (xid, id) ranges whose rows the calling statement can see,
-- in order: split at each transaction in progress in its snapshot, ending
-- at the snapshot's xmax, or past the session's own transaction, whose
-- rows it sees, when that began later. A range holds the rows above
-- (after_xid, after_id) with an xid below before_xid; there are as many as
-- transactions in progress, each an index probe. Inline, not a function of
-- its own, which the runtime role would need EXECUTE on (roles.sql grants
-- the backlog function's callees by name). outbox/status.go keeps a copy
-- in its statement, so that `wlproj status` runs on schema 21 too.
-- +wlproj locks none on outbox_events (catalog only: a view or function over it)
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_queue_backlog_rows(max_rows bigint DEFAULT NULL)
RETURNS TABLE (projection text, id bigint, xid xid8, created_at timestamptz, entity_type text, entity_id text,
               in_flight boolean, locked_by text, lease_until timestamptz, processing_started_at timestamptz)
LANGUAGE sql STABLE
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_hashjoin = off SET jit = off AS $$
WITH ranges AS MATERIALIZED (
  SELECT coalesce(lag(x) OVER w, '0'::xid8) AS after_xid,
         CASE WHEN lag(x) OVER w IS NULL THEN -9223372036854775808 ELSE 9223372036854775807 END AS after_id,
         x AS before_xid
    FROM (SELECT x FROM pg_snapshot_xip(pg_current_snapshot()) x
          UNION ALL
          SELECT CASE WHEN pg_current_xact_id_if_assigned() >= pg_snapshot_xmax(pg_current_snapshot())
                      THEN '18446744073709551615'::xid8 ELSE pg_snapshot_xmax(pg_current_snapshot()) END) stops
  WINDOW w AS (ORDER BY x))
SELECT h.projection, e.id, e.xid, e.created_at, e.entity_type, e.entity_id,
       outbox_behind(e.xid, e.id, h.claimed_prev, h.claimed_cur, h.claimed_xid, h.claimed_id) AS in_flight,
       h.locked_by, h.lease_until, h.processing_started_at
  FROM outbox_queue_heads h
 CROSS JOIN LATERAL (
    SELECT q.id, q.xid, q.created_at, q.entity_type, q.entity_id FROM outbox_events q
     WHERE q.status = 'queued' AND q.projection = h.projection
       AND q.xid = ANY(ARRAY(SELECT x FROM pg_snapshot_xip(h.done_prev) x
                              WHERE pg_visible_in_snapshot(x, pg_current_snapshot()) OR x = pg_current_xact_id_if_assigned()))
  UNION ALL
    SELECT q.id, q.xid, q.created_at, q.entity_type, q.entity_id
      FROM (SELECT greatest(h.done_xid, pg_snapshot_xmax(h.done_prev)) AS xid,
                   CASE WHEN h.done_xid >= pg_snapshot_xmax(h.done_prev) THEN h.done_id ELSE 0 END AS id) lo
     CROSS JOIN ranges r
     CROSS JOIN LATERAL (
        SELECT q.id, q.xid, q.created_at, q.entity_type, q.entity_id FROM outbox_events q
         WHERE q.status = 'queued' AND q.projection = h.projection
           AND (q.xid, q.id) > (CASE WHEN (lo.xid, lo.id) >= (r.after_xid, r.after_id) THEN lo.xid ELSE r.after_xid END,
                                CASE WHEN (lo.xid, lo.id) >= (r.after_xid, r.after_id) THEN lo.id ELSE r.after_id END)
           AND q.xid < r.before_xid) q
     WHERE r.before_xid > lo.xid
  UNION ALL
    SELECT q.id, q.xid, q.created_at, q.entity_type, q.entity_id FROM outbox_events q
     WHERE q.status = 'queued' AND q.projection = h.projection
       AND q.xid = ANY(ARRAY(SELECT x FROM pg_snapshot_xip(h.done_cur) x
                              WHERE x >= pg_snapshot_xmax(h.done_prev)
                                AND (pg_visible_in_snapshot(x, pg_current_snapshot()) OR x = pg_current_xact_id_if_assigned())))
       AND (q.xid, q.id) <= (h.done_xid, h.done_id)) e
 WHERE NOT outbox_behind(e.xid, e.id, h.done_prev, h.done_cur, h.done_xid, h.done_id)
 LIMIT max_rows
$$;
-- +goose StatementEnd

-- Producers in a two-phase commit: PREPARE TRANSACTION refuses a
-- transaction that ran NOTIFY, which this trigger did on every insert. A
-- producer that prepares sets `SET LOCAL wlproj.notify = off` before its
-- insert: the trigger then sends nothing, and the leader's poll
-- (OUTBOX_POLL_INTERVAL_SECONDS) reads the row once COMMIT PREPARED makes
-- it visible. Any other value, or none, notifies as before.
-- +wlproj locks none on outbox_events (catalog only: a view or function over it)
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_events_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF lower(coalesce(current_setting('wlproj.notify', true), '')) IS DISTINCT FROM 'off' THEN
        PERFORM pg_notify('outbox_events', '');
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +wlproj locks none on outbox_events (catalog only: a view or function over it)
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_events_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox_events', '');
    RETURN NULL;
END
$$;
-- +goose StatementEnd

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
     WHERE q.status = 'queued' AND q.projection = h.projection
       AND (q.xid, q.id) > (greatest(h.done_xid, pg_snapshot_xmax(h.done_prev)),
                            CASE WHEN h.done_xid >= pg_snapshot_xmax(h.done_prev) THEN h.done_id ELSE 0 END)
  UNION ALL
    SELECT q.id, q.xid, q.created_at, q.entity_type, q.entity_id FROM outbox_events q
     WHERE q.status = 'queued' AND q.projection = h.projection
       AND q.xid = ANY(ARRAY(SELECT x FROM pg_snapshot_xip(h.done_cur) x WHERE x >= pg_snapshot_xmax(h.done_prev)))
       AND (q.xid, q.id) <= (h.done_xid, h.done_id)) e
 WHERE NOT outbox_behind(e.xid, e.id, h.done_prev, h.done_cur, h.done_xid, h.done_id)
 LIMIT max_rows
$$;
-- +goose StatementEnd

-- +goose NO TRANSACTION
-- +goose Up
-- The backlog's walk of the rows past each position starts at the
-- position: its lower bound is one row comparison, the later of the
-- position and (xmax of its first snapshot, 0). Given both a row bound and
-- xid >= xmax, the index walk started at the row bound, and a drained
-- position's is (0, 0): every gauge read walked every queued row the
-- retention keeps (12k buffers at 3.5 M rows in the held soak). The same
-- rows, the same columns: a binary of 19 reads it as before.
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

-- +goose Down
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

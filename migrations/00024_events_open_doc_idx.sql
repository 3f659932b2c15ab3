-- +goose NO TRANSACTION
-- +goose Up
-- The ledger's rotation asks, of each entry it judges, whether an event of
-- its document could still be sent: one pending, processing, failed or
-- discarded (the queued ones it reads once per rotation, from the
-- backlog). Without an index on the document, each entry read every such
-- row through the status indexes: one page of 1,000 entries beside 300,000
-- failed rows read 7 M buffers and took 88 s, holding its snapshot. With
-- it, one probe per entry. Queued and done rows, nearly all of the outbox,
-- are not in it: a producer's insert does not touch it.
--
-- Postgres builds no index CONCURRENTLY on a partitioned table (00021): each
-- partition's is built CONCURRENTLY, then attached to the parent's, which is
-- created ON ONLY the parent, builds nothing, and is invalid (unused) until
-- all three are attached. A rerun passes over what is done: an invalid
-- partition's index is dropped and built again by the runner, an index
-- attached already is attached again as a no-op.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_events_0_open_doc_idx ON outbox_events_0 (projection, entity_type, entity_id)
    WHERE status IN ('pending', 'processing', 'failed', 'discarded');
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_events_1_open_doc_idx ON outbox_events_1 (projection, entity_type, entity_id)
    WHERE status IN ('pending', 'processing', 'failed', 'discarded');
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_events_2_open_doc_idx ON outbox_events_2 (projection, entity_type, entity_id)
    WHERE status IN ('pending', 'processing', 'failed', 'discarded');
-- +wlproj locks SHARE on outbox_events (brief, catalog only: ON ONLY builds nothing; producers wait at most the lock timeout)
CREATE INDEX IF NOT EXISTS outbox_events_open_doc_idx ON ONLY outbox_events (projection, entity_type, entity_id)
    WHERE status IN ('pending', 'processing', 'failed', 'discarded');
-- +wlproj locks ACCESS EXCLUSIVE on outbox_events_0_open_doc_idx (brief, catalog only: its partition's writers wait at most the lock timeout)
ALTER INDEX outbox_events_open_doc_idx ATTACH PARTITION outbox_events_0_open_doc_idx;
-- +wlproj locks ACCESS EXCLUSIVE on outbox_events_1_open_doc_idx (brief, catalog only: its partition's writers wait at most the lock timeout)
ALTER INDEX outbox_events_open_doc_idx ATTACH PARTITION outbox_events_1_open_doc_idx;
-- +wlproj locks ACCESS EXCLUSIVE on outbox_events_2_open_doc_idx (brief, catalog only: its partition's writers wait at most the lock timeout)
ALTER INDEX outbox_events_open_doc_idx ATTACH PARTITION outbox_events_2_open_doc_idx;

-- +goose Down
-- A partitioned index is dropped with its partitions' in one statement, not
-- CONCURRENTLY (Postgres has no such drop): ACCESS EXCLUSIVE on
-- outbox_events for the catalog change only.
DROP INDEX IF EXISTS outbox_events_open_doc_idx;

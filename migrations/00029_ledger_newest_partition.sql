-- +goose NO TRANSACTION
-- +goose Up
-- A document's ledger entry is read from the newest partition that holds
-- one, in the rotation's order (current, then the one before, then the
-- oldest), instead of the newest of all three. Every read of queued rows
-- and every claim looks an entry up per event: three index probes became
-- one while the current partition holds the document, and the two older
-- partitions' indexes drop out of the buffer cache's working set. In the
-- soak (2,000 events/s over 100,000 books, 10-minute retention) the three
-- partitions' indexes grew past shared_buffers, and the read with its
-- lookup went from 60 to 170 us per event as they filled.
--
-- Why the newest partition's entry is the document's entry: an entry is
-- only ever inserted newer than every entry of its document committed
-- before it, and into the partition current when it is inserted.
--   * The leader inserts a document's entries in order: a batch sharing a
--     document with an earlier one of its term waits for it and takes its
--     advances (consume/order.go), and only events above the entry it knows
--     are written (consume/ack.go).
--   * A new leader's term starts after every ledger write of the term
--     before it has committed: outbox_ledger_barrier() below, run when the
--     term takes the ledger (UPDATE ... SET log_only), waits for them, and
--     a write that begins later sees the new epoch and is fenced.
--   * The rotation's carry copies an entry into the current partition only
--     when no partition holds one as new.
-- So a newer partition never holds an older entry than an older partition.
-- +wlproj locks none (catalog only: a function and a trigger on a one-row table)
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_ledger_entry(p text, t text, i text) RETURNS SETOF outbox_ledger
LANGUAGE sql STABLE AS $$
    (SELECT * FROM outbox_ledger
      WHERE slot = (SELECT outbox_ledger_slot()) AND projection = p AND entity_type = t AND entity_id = i
      ORDER BY version DESC, event_id DESC LIMIT 1)
    UNION ALL
    (SELECT * FROM outbox_ledger
      WHERE slot = ((SELECT outbox_ledger_slot()) + 2) % 3 AND projection = p AND entity_type = t AND entity_id = i
      ORDER BY version DESC, event_id DESC LIMIT 1)
    UNION ALL
    (SELECT * FROM outbox_ledger
      WHERE slot = ((SELECT outbox_ledger_slot()) + 1) % 3 AND projection = p AND entity_type = t AND entity_id = i
      ORDER BY version DESC, event_id DESC LIMIT 1)
    LIMIT 1
$$;
-- +goose StatementEnd

-- The barrier: SHARE on the ledger's parent waits for every transaction
-- writing into it (an INSERT holds ROW EXCLUSIVE on it from before its
-- snapshot to its commit) and lets readers be. Those that ask after it
-- take their snapshot after this transaction, which follows the new
-- epoch, and their fencing guard refuses them. SECURITY DEFINER: the
-- runtime role may only insert into the parent, which allows no SHARE
-- lock. lock_timeout: a writer stuck for 10 s fails the term's start, and
-- the leader tries again, rather than leaving every ack queued behind it.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_ledger_barrier() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET lock_timeout = '10s' SET search_path = pg_catalog, public AS $$
BEGIN
    LOCK TABLE ONLY public.outbox_ledger IN SHARE MODE;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- A statement trigger fires on every term's UPDATE of log_only, even when
-- it changes no row, and for the binaries of 19 to 28 as well.
-- +goose StatementBegin
CREATE OR REPLACE TRIGGER outbox_ledger_barrier BEFORE UPDATE OF log_only ON outbox_ledger_rotation
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_ledger_barrier();
-- +goose StatementEnd

-- +goose Down
-- Back to the newest entry of all three partitions, which holds whatever
-- order the entries were written in.
DROP TRIGGER IF EXISTS outbox_ledger_barrier ON outbox_ledger_rotation;
DROP FUNCTION IF EXISTS outbox_ledger_barrier();
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_ledger_entry(p text, t text, i text) RETURNS SETOF outbox_ledger
LANGUAGE sql STABLE AS $$
    SELECT * FROM outbox_ledger
     WHERE projection = p AND entity_type = t AND entity_id = i
     ORDER BY version DESC, event_id DESC LIMIT 1
$$;
-- +goose StatementEnd

-- +goose Up
-- A document's ledger entry from the newest partition that holds one:
-- current, then the one before, then the oldest, stopping at the first
-- that has an entry of the document. Before, every lookup read the first
-- entry of each of the three partitions and took the highest, three index
-- descents; once rotation had filled all three (two rotation periods after
-- an install), the read and the claim paid them for every event, and
-- Postgres's CPU per event rose by half over a 30-minute soak whose
-- retention rotated every 5 minutes.
--
-- Exact, not a guess: a document's entries are inserted in increasing
-- (version, event_id). The ack inserts only events it applied, which the
-- leader sent because they were above the entry (fenced by its epoch, one
-- batch per document in flight), and the rotation copies forward only a
-- document's newest entry; and every entry goes to the partition current
-- when it is inserted. So the partition written last that has an entry of
-- the document has its newest one. Within a partition the highest
-- (version, event_id) wins, as before.
-- +wlproj locks none (catalog only: a function over the ledger)
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_ledger_entry(p text, t text, i text) RETURNS SETOF outbox_ledger
LANGUAGE sql STABLE AS $$
    SELECT * FROM (
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
    ) newest_first
    LIMIT 1
$$;
-- +goose StatementEnd

-- +goose Down
-- +wlproj locks none (catalog only: a function over the ledger)
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_ledger_entry(p text, t text, i text) RETURNS SETOF outbox_ledger
LANGUAGE sql STABLE AS $$
    SELECT * FROM outbox_ledger
     WHERE projection = p AND entity_type = t AND entity_id = i
     ORDER BY version DESC, event_id DESC LIMIT 1
$$;
-- +goose StatementEnd

-- +goose Up
-- A row is written three times (insert, claim, ack) but its payload only
-- once: kept out of line, the claim and the ack copy an 18-byte pointer
-- instead of the payload, and write that much less WAL.
ALTER TABLE outbox_events ALTER COLUMN payload SET STORAGE EXTERNAL;
ALTER TABLE outbox_events SET (toast_tuple_target = 128);

-- +goose Down
ALTER TABLE outbox_events RESET (toast_tuple_target);
ALTER TABLE outbox_events ALTER COLUMN payload SET STORAGE EXTENDED;

-- +goose Up
-- A repair (wlproj verify --repair) puts a drifted document right through
-- the normal path: it must be sent even when the ledger already holds its
-- version, since the index lost or changed what the ledger says it has.
-- Producers never set it. A constant default adds the column without
-- rewriting the table.
ALTER TABLE outbox_events ADD COLUMN repair boolean NOT NULL DEFAULT false;

-- +goose Down
ALTER TABLE outbox_events DROP COLUMN IF EXISTS repair;

-- +goose Up
-- The leader records the hash of the projections it runs (the projections
-- file's, `wlproj projections list` prints it), with its epoch: a replica,
-- /readyz, the console and `wlproj status` compare their own with it, so
-- replicas whose files disagree are seen before a failover changes what is
-- projected. A table of its own, not a column of outbox_leader: adding one
-- takes ACCESS EXCLUSIVE on outbox_leader, which every ack's fencing reads
-- and the leader's lock connection reads four times a second with a 1 s
-- lock timeout, so a migration waiting there for longer (a
-- MIGRATE_LOCK_TIMEOUT of 2 s behind an old release's long acks) deposed
-- the leader. A new table locks nothing anyone uses.
-- +wlproj locks none (a new table)
CREATE TABLE IF NOT EXISTS outbox_leader_projections (
    name        text        PRIMARY KEY,
    epoch       bigint      NOT NULL,
    projections text        NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
-- +wlproj locks ACCESS EXCLUSIVE on outbox_leader_projections (its own table, read once a poll)
DROP TABLE IF EXISTS outbox_leader_projections;

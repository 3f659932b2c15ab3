-- +goose Up
-- The leader records the hash of the projections it runs (the projections
-- file's, `wlproj projections list` prints it): a replica, /readyz and
-- `wlproj status` compare their own with it, so replicas whose files
-- disagree are seen, before a failover changes what is projected. NULL: a
-- leader of a binary before 22. A nullable column without a default is a
-- catalog change only.
-- +wlproj locks ACCESS EXCLUSIVE on outbox_leader (brief, catalog only)
ALTER TABLE outbox_leader ADD COLUMN projections text;

-- +goose Down
-- +wlproj locks ACCESS EXCLUSIVE on outbox_leader (brief, catalog only)
ALTER TABLE outbox_leader DROP COLUMN projections;

-- +goose Up
-- A console session records how its user signed in: 'password' (the users
-- file, as every session before this migration) or 'oidc' (an OpenID
-- provider), and the groups the provider said the user is in at sign-in,
-- which the console reads with the session on every request rather than
-- trusting the cookie. Both columns have constant defaults, so adding them
-- rewrites no row: the lock is held for a catalog update only, on a table
-- of a few rows that only the console writes.
ALTER TABLE outbox_console_sessions
    ADD COLUMN auth   text   NOT NULL DEFAULT 'password' CHECK (auth IN ('password', 'oidc')),
    ADD COLUMN groups text[] NOT NULL DEFAULT '{}';

-- +goose Down
-- An older binary knows password sessions only: the sessions of OpenID
-- users end with their columns, so none outlives the rollback as a
-- password session of a user the users file may also name.
DELETE FROM outbox_console_sessions WHERE auth <> 'password';
ALTER TABLE outbox_console_sessions DROP COLUMN groups, DROP COLUMN auth;

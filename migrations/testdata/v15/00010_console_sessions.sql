-- +goose Up
-- The operator console's signed-in sessions, one row per sign-in. The cookie
-- carries the id, signed and encrypted with the session key, and every
-- request reads the row by it, so that ending a session is a write every
-- replica sees: sign-out sets revoked_at, and a session whose password_mark
-- (a keyed digest of the user's hash in the users file at sign-in) no longer
-- matches the file is refused, so a password change ends the user's
-- sessions. Sign-in deletes expired rows, a few at a time.
-- +goose StatementBegin
CREATE TABLE outbox_console_sessions (
    id            text        PRIMARY KEY,
    username      text        NOT NULL,
    password_mark text        NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL,
    revoked_at    timestamptz
);
-- +goose StatementEnd
CREATE INDEX outbox_console_sessions_expires_at_idx ON outbox_console_sessions (expires_at);

-- +goose Down
DROP TABLE IF EXISTS outbox_console_sessions;

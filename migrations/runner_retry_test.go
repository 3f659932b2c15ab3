package migrations

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// A deadlock rolls the statement back as a lock timeout does, so it is
// retried the same way within LockWait; any other error ends the migration.
func TestDeadlockIsRetriedLikeALockTimeout(t *testing.T) {
	r := &runner{cfg: Config{LockWait: time.Minute}, log: zerolog.Nop(), waits: map[string]*wait{}}
	f, st := file{Version: 21, Name: "00021_events_rotation.sql"}, statement{SQL: "DO $$ … $$"}
	for code, retried := range map[string]bool{"40P01": true, "55P03": true, "42P01": false} {
		err := r.failed(f, 0, st, time.Second, nil, &pgconn.PgError{Code: code})
		var lt *LockTimeoutError
		require.Equal(t, retried, errors.As(err, &lt) && lt.retry, "SQLSTATE %s", code)
	}
}

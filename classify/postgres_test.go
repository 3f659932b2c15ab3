package classify

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

func TestPostgresErrorsBySQLState(t *testing.T) {
	t.Parallel()
	cases := []struct {
		code string
		want want
	}{
		{"08006", want{Transient, Connection, 0}},         // connection_failure
		{"08P01", want{Transient, Connection, 0}},         // protocol_violation
		{"57P01", want{Transient, Connection, 0}},         // admin_shutdown
		{"57P03", want{Transient, Connection, 0}},         // cannot_connect_now
		{"57014", want{Transient, Timeout, 0}},            // query_canceled
		{"40001", want{Transient, ServerError, 0}},        // serialization_failure
		{"40P01", want{Transient, ServerError, 0}},        // deadlock_detected
		{"53100", want{Transient, ServerError, 0}},        // disk_full
		{"53300", want{Transient, ServerError, 0}},        // too_many_connections
		{"55P03", want{Transient, ServerError, 0}},        // lock_not_available
		{"XX000", want{Transient, ServerError, 0}},        // internal_error
		{"22P02", want{Deterministic, PayloadInvalid, 0}}, // invalid_text_representation
		{"22001", want{Deterministic, PayloadInvalid, 0}}, // string_data_right_truncation
		{"23505", want{Deterministic, PayloadInvalid, 0}}, // unique_violation
		{"23514", want{Deterministic, PayloadInvalid, 0}}, // check_violation
		{"42501", want{Deterministic, ClientError, 0}},    // insufficient_privilege
		{"42P01", want{Deterministic, ClientError, 0}},    // undefined_table
		{"P0001", want{Transient, Unknown, 0}},            // raise_exception
	}
	for _, tc := range cases {
		err := fmt.Errorf("append: %w", &pgconn.PgError{Code: tc.code, Message: "m", Detail: "d"})
		got := Classify(err)
		require.Equal(t, tc.want.class, got.Class, tc.code)
		require.Equal(t, tc.want.reason, got.Reason, tc.code)
		require.Equal(t, "postgres "+tc.code+": m (d)", got.Message, tc.code)
		require.ErrorIs(t, got, err, "the cause is kept")
	}
}

// The same classes from a real server: a data error, a statement timeout,
// and a server nobody listens on.
func TestPostgresErrorsFromTheServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := harness.NewEmptyDatabase(t)

	_, err := db.Pool.Exec(ctx, `SELECT '{not json'::jsonb`)
	require.Error(t, err)
	got := Classify(err)
	require.Equal(t, Deterministic, got.Class, err.Error())
	require.Equal(t, PayloadInvalid, got.Reason)

	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `SET statement_timeout = '20ms'`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `SELECT pg_sleep(1)`)
	require.Error(t, err)
	require.Equal(t, Timeout, Classify(err).Reason, err.Error())
	_, err = conn.Exec(ctx, `RESET statement_timeout`)
	require.NoError(t, err)

	_, err = pgx.Connect(ctx, "postgres://nobody@127.0.0.1:"+strconv.Itoa(harness.Port(t))+"/x?connect_timeout=2")
	require.Error(t, err)
	got = Classify(err)
	require.Equal(t, Connection, got.Reason, err.Error())
	require.Equal(t, Transient, got.Class)
}

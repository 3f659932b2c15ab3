package harness

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// Column is the one column sql returns, a value a row, in order; nil when
// no row comes back, so a test can compare it with require.Empty or a
// literal alike.
func Column[T any](t testing.TB, db DB, sql string, args ...any) []T {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), sql, args...)
	require.NoError(t, err)
	defer rows.Close()
	var out []T
	for rows.Next() {
		var v T
		require.NoError(t, rows.Scan(&v))
		out = append(out, v)
	}
	require.NoError(t, rows.Err())
	return out
}

// Pairs is the two columns sql returns as a map from the first to the
// second; empty, not nil, when no row comes back.
func Pairs[K comparable, V any](t testing.TB, db DB, sql string, args ...any) map[K]V {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), sql, args...)
	require.NoError(t, err)
	defer rows.Close()
	out := map[K]V{}
	for rows.Next() {
		var k K
		var v V
		require.NoError(t, rows.Scan(&k, &v))
		out[k] = v
	}
	require.NoError(t, rows.Err())
	return out
}

// Map is f of each of xs, in order: the ids of the events a call returned,
// say.
func Map[T, U any](xs []T, f func(T) U) []U {
	out := make([]U, len(xs))
	for i, x := range xs {
		out[i] = f(x)
	}
	return out
}

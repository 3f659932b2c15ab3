package main

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"
)

// StatementCost is one statement's share of the database's time in a run,
// as pg_stat_statements counts it (planning and execution, wall time).
type StatementCost struct {
	Query   string  `json:"query"`
	Calls   int64   `json:"calls"`
	TotalMs float64 `json:"total_ms"`
	MeanMs  float64 `json:"mean_ms"`
	Rows    int64   `json:"rows"`
	// Producer marks the application's own insert (with the NOTIFY
	// trigger wlproj installs on it).
	Producer bool `json:"producer"`
}

// statementsTop is how many statements a run reports.
const statementsTop = 8

// resetStatements empties pg_stat_statements for the bench's database and
// reports whether it is there: the local stack loads it, a server of the
// user's may not.
func (b *bench) resetStatements(ctx context.Context) bool {
	if _, err := b.pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		return false
	}
	_, err := b.pool.Exec(ctx, `SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database WHERE datname = current_database()), 0)`)
	return err == nil
}

// readStatements returns the statements run in the bench's database since
// the reset, the costliest first, and the milliseconds spent in wlproj's:
// every statement but the producer's and the bench's own.
func (b *bench) readStatements(ctx context.Context) (top []StatementCost, wlprojMs float64, err error) {
	rows, err := b.pool.Query(ctx, `
		SELECT query, calls, total_plan_time + total_exec_time, rows
		  FROM pg_stat_statements
		 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		 ORDER BY 3 DESC`)
	if err != nil {
		return nil, 0, err
	}
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (StatementCost, error) {
		var s StatementCost
		err := r.Scan(&s.Query, &s.Calls, &s.TotalMs, &s.Rows)
		return s, err
	})
	if err != nil {
		return nil, 0, err
	}
	for _, s := range all {
		s.Producer = isProducerStatement(s.Query)
		if s.Calls > 0 {
			s.MeanMs = s.TotalMs / float64(s.Calls)
		}
		if !s.Producer && !isBenchStatement(s.Query) {
			wlprojMs += s.TotalMs
		}
		if len(top) < statementsTop {
			s.Query = oneLine(s.Query, 160)
			top = append(top, s)
		}
	}
	return top, wlprojMs, nil
}

func isProducerStatement(q string) bool {
	return strings.HasPrefix(strings.TrimSpace(q), "INSERT INTO outbox_events")
}

// isBenchStatement: the bench's own samples of the database.
func isBenchStatement(q string) bool {
	return strings.Contains(q, "pg_stat_") || strings.Contains(q, "pg_database")
}

// oneLine squeezes a statement's whitespace and cuts it at n bytes.
func oneLine(q string, n int) string {
	q = strings.Join(strings.Fields(q), " ")
	if len(q) > n {
		q = q[:n] + "…"
	}
	return q
}

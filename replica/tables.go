package replica

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/wlproj/wlproj/projection"
)

// The tables a projections file names (a chronicle's table, a search
// projection's source table) are checked when the replica starts: a
// missing one, or one without the columns wlproj reads or writes, would
// otherwise fail each of the projection's events, or each verify, long
// after the start that could have refused it.

// tableNeed is a table one projection's key names and what it must have.
type tableNeed struct {
	spec       Spec
	key, table string
	columns    []string
	// unique is the column that needs a unique index of its own, if any.
	unique string
}

// sourceColumns are what rebuild and verify read from a source table.
var sourceColumns = []string{"entity_type", "entity_id", "doc", "version"}

func (s Specs) tableNeeds() []tableNeed {
	var needs []tableNeed
	for _, p := range s {
		switch {
		case p.Kind == KindChronicle && p.Chronicle != nil:
			needs = append(needs, tableNeed{p, "table", p.Chronicle.TableName(), projection.ChronicleColumns, "event_id"})
		case p.Search != nil && p.Search.SourceTable != "":
			needs = append(needs, tableNeed{p, "source_table", p.Search.SourceTable, sourceColumns, ""})
		}
	}
	return needs
}

const tableShapeSQL = `
SELECT to_regclass($1) IS NOT NULL,
       ARRAY(SELECT a.attname::text FROM pg_attribute a
              WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped),
       EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
                WHERE i.indrelid = to_regclass($1) AND i.indisunique AND i.indnkeyatts = 1
                  AND i.indpred IS NULL AND a.attname = $2)`

// tablesCheckTimeout bounds the check: a start does not wait for a
// database that is not there yet.
const tablesCheckTimeout = 5 * time.Second

// checkTables refuses, naming the file, the line, the projection, the key
// and the table, a table that is missing or lacks what wlproj needs of it.
// A database it cannot reach is not a bad table: the replica starts (it
// waits for the database as always) and says it did not check.
func checkTables(ctx context.Context, pool *pgxpool.Pool, specs Specs, fromFile bool, log zerolog.Logger) error {
	if !fromFile || len(specs.tableNeeds()) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, tablesCheckTimeout)
	defer cancel()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		log.Warn().Err(err).Msg("the projections' tables were not checked: the database did not answer")
		return nil
	}
	defer conn.Release()
	_, err = CheckTables(ctx, conn, specs)
	return err
}

// Querier is what CheckTables reads the tables' shapes through: a
// connection of a pool, or one of its own (pgx.Conn).
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// CheckTables checks the tables specs name (a chronicle's table, a search
// projection's source_table) as a replica does when it starts, and returns
// how many it checked. A missing table, or one short of what wlproj needs,
// is a *ProjectionsError naming the file, line, projection and key.
func CheckTables(ctx context.Context, q Querier, specs Specs) (int, error) {
	needs := specs.tableNeeds()
	for _, n := range needs {
		var exists, unique bool
		var columns []string
		if err := q.QueryRow(ctx, tableShapeSQL, n.table, n.unique).Scan(&exists, &columns, &unique); err != nil {
			return 0, fmt.Errorf("projection %q: %s: reading table %s: %w", n.spec.Name, n.key, n.table, err)
		}
		if problem := n.problem(exists, columns, unique); problem != "" {
			return 0, n.spec.at(n.key, "%s", problem)
		}
	}
	return len(needs), nil
}

// problem says what the table lacks, "" when nothing.
func (n tableNeed) problem(exists bool, columns []string, unique bool) string {
	if !exists {
		return fmt.Sprintf("table %s does not exist in the outbox's database", n.table)
	}
	var missing []string
	for _, c := range n.columns {
		if !slices.Contains(columns, c) {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return fmt.Sprintf("table %s lacks column(s) %s (it needs %s)", n.table, strings.Join(missing, ", "), strings.Join(n.columns, ", "))
	}
	if n.unique != "" && !unique {
		return fmt.Sprintf("table %s has no unique index on %s alone (a resend must append nothing)", n.table, n.unique)
	}
	return ""
}

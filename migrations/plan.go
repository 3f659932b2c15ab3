package migrations

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"strings"
)

// PlannedStatement is one statement a migration would run.
type PlannedStatement struct {
	SQL string
	// Lock is the table lock it takes, by statement kind.
	Lock Lock
	// RequiresExtension: it runs only when this extension is installed.
	RequiresExtension string
}

// PlannedMigration is one migration that Up would apply.
type PlannedMigration struct {
	Version int64
	File    string
	// OneTransaction: the statements commit together; otherwise each
	// commits alone and the file is rerun from its start after a failure.
	OneTransaction bool
	Statements     []PlannedStatement
}

// Plan is what Up would do, found without changing anything.
type Plan struct {
	Target  Target
	Current int64
	Pending []PlannedMigration
}

// DryRun checks the guard and lists the migrations Up would apply, with each
// statement's lock. It only reads: it takes no lock and creates nothing, not
// even goose's version table.
func DryRun(ctx context.Context, databaseURL string, want Expect, cfg Config) (Plan, error) {
	db, target, err := open(ctx, databaseURL, want, cfg)
	plan := Plan{Target: target}
	if err != nil {
		return plan, err
	}
	defer db.Close()
	applied, err := appliedVersions(ctx, db)
	if err != nil {
		return plan, err
	}
	files, err := loadFiles(embedded)
	if err != nil {
		return plan, err
	}
	for v := range applied {
		plan.Current = max(plan.Current, v)
	}
	for _, f := range files {
		if applied[f.Version] || (cfg.UpTo > 0 && f.Version > cfg.UpTo) {
			continue
		}
		pm := PlannedMigration{Version: f.Version, File: f.Name, OneTransaction: !f.NoTx}
		created := map[string]bool{}
		for _, st := range f.Up {
			pm.Statements = append(pm.Statements, PlannedStatement{SQL: st.SQL, Lock: lockOf(st, created), RequiresExtension: st.RequiresExtension})
			if t := createdTable(st); t != "" {
				created[t] = true
			}
		}
		plan.Pending = append(plan.Pending, pm)
	}
	return plan, nil
}

// appliedVersions reads goose's table the way goose does (the newest row of
// a version says whether it is applied); no table means nothing applied.
func appliedVersions(ctx context.Context, db *sql.DB) (map[int64]bool, error) {
	out := map[int64]bool{}
	var exists bool
	if err := db.QueryRowContext(ctx, `SELECT to_regclass('goose_db_version') IS NOT NULL`).Scan(&exists); err != nil {
		return nil, err
	}
	if !exists {
		return out, nil
	}
	rows, err := db.QueryContext(ctx, `
		SELECT DISTINCT ON (version_id) version_id, is_applied
		  FROM goose_db_version WHERE version_id > 0 ORDER BY version_id, id DESC`)
	if err != nil {
		return nil, fmt.Errorf("read goose_db_version: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var v int64
		var ok bool
		if err := rows.Scan(&v, &ok); err != nil {
			return nil, err
		}
		if ok {
			out[v] = true
		}
	}
	return out, rows.Err()
}

// Write prints the plan for an operator: each migration, how it commits,
// and per statement the lock it takes and its first line.
func (p Plan) Write(w io.Writer) {
	if len(p.Pending) == 0 {
		fmt.Fprintf(w, "dry run: nothing to apply, schema at version %d (%s)\n", p.Current, p.Target)
		return
	}
	fmt.Fprintf(w, "dry run: would apply %d migration(s) to %s, now at version %d; nothing was changed\n",
		len(p.Pending), p.Target, p.Current)
	for _, m := range p.Pending {
		how := "each statement commits alone"
		if m.OneTransaction {
			how = "one transaction"
		}
		fmt.Fprintf(w, "\n%s (%s)\n", m.File, how)
		for _, st := range m.Statements {
			fmt.Fprintf(w, "  %s\n", firstLine(st.SQL))
			lock := "    lock: " + st.Lock.String()
			if st.RequiresExtension != "" {
				lock += "; only if extension " + st.RequiresExtension + " is installed"
			}
			fmt.Fprintln(w, lock)
		}
	}
	var blocking []string
	for _, m := range p.Pending {
		for _, st := range m.Statements {
			if st.Lock.Mode == "ACCESS EXCLUSIVE" || st.Lock.Mode == "SHARE" || st.Lock.Mode == "SHARE ROW EXCLUSIVE" {
				blocking = append(blocking, fmt.Sprintf("%s: %s on %s", m.File, st.Lock.Mode, st.Lock.Table))
			}
		}
	}
	if len(blocking) > 0 {
		fmt.Fprintf(w, "\nstatements that block writes while they hold their lock (each waits at most the lock timeout for it, then retries):\n  %s\n",
			strings.Join(blocking, "\n  "))
	}
}

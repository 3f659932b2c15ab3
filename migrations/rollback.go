package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/rs/zerolog"

	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/outbox"
)

// Rollback is what wlproj migrate --down asks: the version to go back to,
// and who asks and why, for the audit log.
type Rollback struct {
	// To is the version the schema is left at: every migration after it is
	// undone, newest first. It must be one of this binary's migrations.
	To int64
	// By and Why are recorded in the audit row. Required.
	By, Why string
}

// auditActionVersion is the migration that lets the audit log record a
// rollback (action migrate); its Down keeps that, so the rows stay valid.
const auditActionVersion = 25

// Down checks the guard and rb, records the rollback in the audit log
// (outbox_replay_audit, action migrate: who, why, when, from and to which
// version, what is undone), then undoes every migration after rb.To, newest
// first, under the same advisory lock, lock timeout and retries as Up.
// Refused, it changes nothing.
func Down(ctx context.Context, databaseURL string, want Expect, cfg Config, rb Rollback, log zerolog.Logger) (Result, error) {
	known, err := knownVersions()
	if err != nil {
		return Result{}, err
	}
	if err := rb.validate(known); err != nil {
		return Result{}, err
	}
	before := func(ctx context.Context, db *sql.DB, applied map[int64]bool) error {
		undo, err := rb.undo(known, applied)
		if err != nil {
			return err
		}
		return rb.audit(ctx, db, undo, applied[outbox.AuditActorVersion])
	}
	return migrate(ctx, databaseURL, want, cfg, log, before, func(ctx context.Context, p *goose.Provider) ([]*goose.MigrationResult, error) {
		return p.DownTo(ctx, rb.To)
	})
}

// knownVersions are the migrations this binary carries, oldest first.
func knownVersions() ([]int64, error) {
	files, err := loadFiles(embedded)
	if err != nil {
		return nil, err
	}
	out := make([]int64, len(files))
	for i, f := range files {
		out[i] = f.Version
	}
	return out, nil
}

func (rb Rollback) validate(known []int64) error {
	switch {
	case strings.TrimSpace(rb.By) == "":
		return bounds.Invalid("By", "is required: who is rolling the schema back")
	case strings.TrimSpace(rb.Why) == "":
		return bounds.Invalid("Why", "is required: why the schema is rolled back (the incident or the ticket)")
	case !slices.Contains(known, rb.To):
		return bounds.Invalid("To", "must be one of this binary's migrations (%d to %d), got %d", known[0], known[len(known)-1], rb.To)
	}
	return nil
}

// undo is what going down to rb.To undoes, newest first, refusing a
// database at or before rb.To, or one with a migration this binary does
// not carry (its Down is not here).
func (rb Rollback) undo(known []int64, applied map[int64]bool) ([]int64, error) {
	var undo []int64
	for v := range applied {
		if !slices.Contains(known, v) {
			return nil, fmt.Errorf("refusing to roll back: the database has migration %d, which this binary does not carry: "+
				"roll back with the binary that applied it; nothing was changed", v)
		}
		if v > rb.To {
			undo = append(undo, v)
		}
	}
	if len(undo) == 0 {
		return nil, fmt.Errorf("refusing to roll back: no migration after %d is applied; nothing was changed", rb.To)
	}
	slices.Sort(undo)
	slices.Reverse(undo)
	if !applied[auditActionVersion] {
		return nil, fmt.Errorf("refusing to roll back: the audit log records a rollback from migration %05d on, "+
			"and this database is at %d: wlproj migrate first, or roll back with the binary that migrated it; nothing was changed",
			auditActionVersion, undo[0])
	}
	return undo, nil
}

// audit writes the rollback's audit row, in its own transaction, before
// anything is undone: a rollback that fails halfway is on record too.
func (rb Rollback) audit(ctx context.Context, db *sql.DB, undo []int64, withActor bool) error {
	write := outbox.WriteAudit
	if !withActor {
		write = outbox.WriteAuditBefore27
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.Raw(func(dc any) error {
		c, ok := dc.(*stdlib.Conn)
		if !ok {
			return errors.New("audit: not a pgx connection")
		}
		tx, err := c.Conn().Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx) //nolint:errcheck
		_, _, err = write(ctx, tx, outbox.Audit{Action: "migrate", By: rb.By, Why: rb.Why,
			Selector: map[string]any{"direction": "down", "from": undo[0], "to": rb.To, "undo": undo}, Count: int64(len(undo))})
		if err != nil {
			return fmt.Errorf("refusing to roll back: %w; nothing was changed", err)
		}
		return tx.Commit(ctx)
	})
}

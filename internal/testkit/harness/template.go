package harness

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/jackc/pgx/v5"
)

// A test's migrated database is a copy of a template migrated once (CREATE
// DATABASE … TEMPLATE), not migrated anew: on the stack's Postgres a
// migration cost 0.37 CPU-s and 0.51 s a database, a copy 0.11 and 0.08,
// and the suite makes hundreds. The template is named by a hash of
// migrations/*.sql, so an edited migration gets a template of its own
// (stale ones are dropped); it allows no connection, so none (nor
// autovacuum) is open when it is copied, and it lives as long as the
// stack's cluster. Tools and the migration tests migrate their own.

// templatePrefix names the templates; templateLock is the advisory lock
// that lets one test process of a run build the template while the others
// wait for it.
const (
	templatePrefix = "wlproj_template_"
	templateLock   = 0x776c70726f6a // "wlproj"
)

// volatileRows are the rows a migration writes with the moment it ran (its
// snapshot, transaction or time), set again on each copy as if migrated
// then: a rotation opened long ago would rotate at once, an old origin
// would date the queue. TestTemplateCopyIsAFreshMigration fails when a
// migration writes another such row and it is not listed here.
var volatileRows = []string{
	`UPDATE outbox_queue_origin SET snapshot = pg_current_snapshot(), since = now()`,
	`UPDATE outbox_ledger_rotation SET opened_at = now()`,
	`UPDATE outbox_events_rotation SET opened_at = now()`,
	`UPDATE outbox_queue_home SET recorded_xid = pg_current_xact_id(), recorded_at = now()`,
}

var templates = struct {
	sync.Mutex
	ready map[string]string // admin URL -> the template's name
}{ready: map[string]string{}}

// copyMigratedDatabase creates name as a copy of the migrated template,
// as CreateDatabase would have left it, and returns its URL.
func copyMigratedDatabase(ctx context.Context, adminURL, name string) (string, error) {
	tmpl, err := migratedTemplate(ctx, adminURL)
	if err != nil {
		return "", err
	}
	dbURL, err := createDatabase(ctx, adminURL, name, tmpl)
	if err != nil {
		return "", err
	}
	if err := adminExec(ctx, dbURL, volatileRows...); err != nil {
		return "", fmt.Errorf("a copy of %s: %w", tmpl, err)
	}
	return dbURL, nil
}

// migratedTemplate returns the name of the template of the checkout's
// migrations on the admin's server, building it if no test process has.
func migratedTemplate(ctx context.Context, adminURL string) (string, error) {
	templates.Lock()
	defer templates.Unlock()
	if name, ok := templates.ready[adminURL]; ok {
		return name, nil
	}
	hash, err := migrationsHash()
	if err != nil {
		return "", err
	}
	name := templatePrefix + hash
	if err := buildTemplate(ctx, adminURL, name); err != nil {
		return "", fmt.Errorf("the migrated template %s: %w", name, err)
	}
	templates.ready[adminURL] = name
	return name, nil
}

// buildTemplate makes name a migrated template unless it is one, under
// the advisory lock: other test processes wait, then find it built.
func buildTemplate(ctx context.Context, adminURL, name string) error {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return fmt.Errorf("connect as admin: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, templateLock); err != nil {
		return err
	}
	var built bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1 AND datistemplate)`, name).Scan(&built); err != nil || built {
		return err
	}
	if err := dropTemplates(ctx, conn, name); err != nil {
		return err
	}
	if _, err := CreateDatabase(ctx, adminURL, name); err != nil {
		return err
	}
	_, err = conn.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH IS_TEMPLATE true ALLOW_CONNECTIONS false")
	return err
}

// dropTemplates drops the templates of other migrations, and name if a
// build of it stopped half way. A copy under way holds the drop back.
func dropTemplates(ctx context.Context, conn *pgx.Conn, name string) error {
	rows, err := conn.Query(ctx, `SELECT datname FROM pg_database WHERE datname LIKE $1 || '%' AND (datname <> $2 OR NOT datistemplate)`, templatePrefix, name)
	if err != nil {
		return err
	}
	stale, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, db := range stale {
		id := pgx.Identifier{db}.Sanitize()
		if _, err := conn.Exec(ctx, "ALTER DATABASE "+id+" WITH IS_TEMPLATE false"); err != nil {
			return err
		}
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+id+" WITH (FORCE)"); err != nil {
			return err
		}
	}
	return nil
}

// migrationsHash is 16 hex digits of the SHA-256 of the checkout's
// migrations/*.sql, names and contents: what the test binary embeds.
func migrationsHash() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	files, err := filepath.Glob(filepath.Join(root, "migrations", "*.sql"))
	if err != nil || len(files) == 0 {
		return "", fmt.Errorf("no migrations/*.sql under %s: %v", root, err)
	}
	sort.Strings(files)
	h := sha256.New()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", filepath.Base(f), len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

package consume

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/classify"
	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
)

// setupRuntime is setup with deploy/sql/roles.sql applied, as the README's
// setup has it: the store logs in as the runtime role, as `wlproj run`
// does, and the admin's pool (b.DB) plays the producers and the operator.
func setupRuntime(t *testing.T) bundle {
	t.Helper()
	b, _ := setupRuntimeRoles(t)
	return b
}

// runtimeRoles are the names roles.sql was applied with.
type runtimeRoles struct{ owner, runtime string }

// setupRuntimeRoles is setupRuntime, and the roles' names.
func setupRuntimeRoles(t *testing.T) (bundle, runtimeRoles) {
	t.Helper()
	// Before the database, so the roles are dropped after it.
	owner, runtime := harness.Roles(t, "prune")
	db := harness.NewDatabase(t)
	out, err := harness.ApplyRoles(t, db.URL, db.Name, owner, runtime)
	require.NoError(t, err, out)
	b := runtimeBundle(t, db, runtime)
	b.Lead(t, 1)
	return b, runtimeRoles{owner: owner, runtime: runtime}
}

// runtimeBundle is db with a store logged in as the runtime role.
func runtimeBundle(t *testing.T, db harness.DB, runtime string) bundle {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), db.Login(t, runtime, harness.RuntimePassword))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return bundle{DB: db, Store: &outbox.Store{Pool: pool, Owner: "w1", LeaderName: "test"}}
}

// versionIndex is a latest-only projection that keeps each document at its
// newest version, as the engine does under external versioning, and
// refuses the documents named bad* as a strict mapping would.
type versionIndex struct {
	mu   sync.Mutex
	docs map[string]indexedDoc
}

type indexedDoc struct {
	version int64
	deleted bool
}

func (*versionIndex) LatestOnly() bool { return true }

func (x *versionIndex) Handle(_ context.Context, events []outbox.Event) []projection.Result {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := make([]projection.Result, len(events))
	for i, e := range events {
		out[i].ID = e.ID
		if strings.HasPrefix(e.EntityID, "bad") {
			out[i].Err = classify.New(classify.MappingError, "strict mapping")
			continue
		}
		if d, ok := x.docs[e.EntityID]; ok && d.version > e.Version() {
			out[i].Superseded = true
			continue
		}
		x.docs[e.EntityID] = indexedDoc{version: e.Version(), deleted: e.Op == outbox.OpDelete}
	}
	return out
}

// drain runs the loop until a round finds nothing to do.
func drain(t *testing.T, loop *Loop) {
	t.Helper()
	for {
		res, err := loop.runOnce(context.Background(), 1)
		require.NoError(t, err)
		if res == (BatchResult{}) {
			return
		}
	}
}

// Both rotations run as the runtime role of deploy/sql/roles.sql, with a
// retention of a second, between rounds of the loop: the partitions really
// go (the rows of the first round are gone but for the failed ones the
// carry moved, the ledger holds fewer entries than were written), and no
// event is lost: each row is done, or failed as its projection said, or
// gone after it was done, and the index holds every document at its newest
// event.
func TestPrunerRotatesBothTablesAsTheRuntimeRole(t *testing.T) {
	t.Parallel()
	b := setupRuntime(t)
	ctx := context.Background()
	index := &versionIndex{docs: map[string]indexedDoc{}}
	loop, err := NewLoop(Config{}, b.Store, projection.Registry{"search": index}, zerolog.Nop())
	require.NoError(t, err)
	p, err := NewPruner(PrunerConfig{Retention: time.Second, TombstoneRetention: time.Second, Batch: 10}, b.Store, zerolog.Nop())
	require.NoError(t, err)

	want := map[string]indexedDoc{}
	inserted := map[int64]string{}
	doneBeforeRotation := map[int64]bool{}
	var firstRound []int64
	var eventsRotated, ledgerRotated, carried int
	const rounds, docs = 10, 30
	for round := range rounds {
		// Each round a new version of every document; a fifth of them
		// deletes; every seventh document is one the mapping refuses.
		ids := harness.Pairs[int64, string](t, b.DB, `
			INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload)
			SELECT 'book', CASE WHEN g % 7 = 0 THEN 'bad' ELSE 'd' END || g,
			       CASE WHEN g % 5 = $1 % 5 THEN 'delete' ELSE 'upsert' END, $1 + 1, '{}'
			  FROM generate_series(0, $2 - 1) g
			RETURNING id, entity_id`, round, docs)
		for id, doc := range ids {
			inserted[id] = doc
			if round == 0 {
				firstRound = append(firstRound, id)
			}
		}
		for g := range docs {
			if g%7 != 0 {
				want["d"+strconv.Itoa(g)] = indexedDoc{version: int64(round + 1), deleted: g%5 == round%5}
			}
		}
		drain(t, loop)
		for _, id := range harness.Column[int64](t, b.DB, `SELECT id FROM outbox_event_states WHERE status = 'done'`) {
			doneBeforeRotation[id] = true
		}
		time.Sleep(600 * time.Millisecond) // past half the retention: both partitions are due
		res, err := p.runOnce(ctx, 1)
		require.NoError(t, err, "round %d", round)
		eventsRotated += btoi(res.Events.Rotated)
		ledgerRotated += btoi(res.Ledger.Rotated)
		carried += int(res.Events.Carried)
	}
	t.Logf("%d rounds: the outbox rotated %d times (%d rows carried), the ledger %d times", rounds, eventsRotated, carried, ledgerRotated)
	require.GreaterOrEqual(t, eventsRotated, 3, "the outbox's partitions were emptied, each at least once")
	require.GreaterOrEqual(t, ledgerRotated, 3, "the ledger's partitions were emptied, each at least once")
	require.Equal(t, docs/7+1, b.Int(t, `SELECT count(*) FROM outbox_events WHERE id = ANY($1)`, firstRound),
		"of the first round only the failed rows are left, carried from partition to partition")
	require.Less(t, b.Int(t, `SELECT count(*) FROM outbox_ledger`), rounds*(docs-docs/7-1), "the ledger's old entries went")

	states := harness.Pairs[int64, string](t, b.DB, `SELECT id, status FROM outbox_event_states`)
	for id, doc := range inserted {
		got, ok := states[id]
		switch {
		case !ok:
			require.True(t, doneBeforeRotation[id], "event %d (%s) is gone, and was not done when a rotation ran", id, doc)
		case strings.HasPrefix(doc, "bad"):
			require.Equal(t, "failed", got, "event %d (%s)", id, doc)
		default:
			require.Equal(t, "done", got, "event %d (%s)", id, doc)
		}
	}
	require.Equal(t, want, index.docs, "every document at its newest event")
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// The ledger's rotation does not wait on the outbox's: with the outbox's
// failing every round (its rotation's row deleted by hand), the ledger
// still rotates, and the failure shows in outbox_rotation_errors_total by
// table and class while the ledger's last success moves on.
func TestPrunerRotatesTheLedgerWhileTheOutboxRotationFails(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ledgerEntry(t, b, "old-live", false, 4*time.Hour)
	b.Exec(t, `DELETE FROM outbox_events_rotation`)
	p, err := NewPruner(PrunerConfig{Retention: time.Hour}, b.Store, zerolog.Nop())
	require.NoError(t, err)
	failed := rotationErrorsTotal("outbox_events", "no_rotation_row")
	before, start := failed.Get(), time.Now().Unix()

	for range 3 {
		b.Exec(t, `UPDATE outbox_ledger_rotation SET opened_at = opened_at - interval '30 minutes'`)
		res, err := p.runOnce(context.Background(), 1)
		require.ErrorIs(t, err, outbox.ErrNoRotationRow)
		require.ErrorContains(t, err, "rotate outbox_events: ")
		require.True(t, res.Ledger.Rotated, "the ledger rotates all the same")
	}
	require.Equal(t, before+3, failed.Get(), "each failed round counted, by table and class")
	require.GreaterOrEqual(t, rotationLastSuccess("outbox_ledger").Get(), float64(start))
	require.Empty(t, ledgerLeft(t, b), "the old entry went with its partition")
}

func TestRotationErrorClass(t *testing.T) {
	t.Parallel()
	for want, err := range map[string]error{
		"permission_denied":  &pgconn.PgError{Code: "42501"},
		"lock_not_available": fmt.Errorf("reopen outbox_ledger_1: %w", &pgconn.PgError{Code: "55P03"}),
		"canceled":           &pgconn.PgError{Code: "57014"},
		"connection":         &pgconn.PgError{Code: "57P01"},
		"no_rotation_row":    fmt.Errorf("%w: the outbox's rotation has no row", outbox.ErrNoRotationRow),
		"other":              &pgconn.PgError{Code: "23505"},
	} {
		require.Equal(t, want, rotationErrorClass(err), "%v", err)
	}
	require.Equal(t, "connection", rotationErrorClass(&net.OpError{Op: "read", Err: io.ErrUnexpectedEOF}))
	require.ElementsMatch(t, rotationErrorClasses, []string{"permission_denied", "lock_not_available", "canceled",
		"no_rotation_row", "connection", "other"})
}

package migrations_test

import (
	"context"
	"os"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/migrations"

	_ "github.com/jackc/pgx/v5/stdlib"
)

// legacyUp applies the migration files as they were before the runner
// (testdata/v15) with plain goose, up to version: the schema an existing
// install has.
func legacyUp(t *testing.T, dbURL string, version int64) {
	t.Helper()
	db, err := goose.OpenDBWithDriver("pgx", dbURL)
	require.NoError(t, err)
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, os.DirFS("testdata/v15"))
	require.NoError(t, err)
	if version > 0 {
		_, err = p.UpTo(context.Background(), version)
	} else {
		_, err = p.Up(context.Background())
	}
	require.NoError(t, err)
}

// migrateRows is the outbox size of TestMigrateDoesNotBlockProducers:
// WLPROJ_MIGRATE_ROWS, 100 000 by default so that make test stays fast;
// 1000000 is the size the issue asks about.
func migrateRows(t *testing.T) int {
	if s := os.Getenv("WLPROJ_MIGRATE_ROWS"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err, "WLPROJ_MIGRATE_ROWS")
		return n
	}
	return 100_000
}

type sample struct {
	at  time.Time
	dur time.Duration
}

// producer inserts one event at a time, as an application would, and
// records each insert's latency until ctx ends.
func producer(ctx context.Context, t *testing.T, dbURL string) func() []sample {
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	var (
		mu      sync.Mutex
		samples []sample
		done    = make(chan struct{})
	)
	go func() {
		defer close(done)
		defer conn.Close(context.Background())
		for i := 0; ctx.Err() == nil; i++ {
			start := time.Now()
			_, err := conn.Exec(ctx, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload)
				VALUES ('book', $1, 'upsert', $2, '{"title":"produced"}')`, "p"+strconv.Itoa(i%500), i+1)
			if err != nil {
				if ctx.Err() == nil {
					t.Errorf("producer insert: %v", err)
				}
				return
			}
			mu.Lock()
			samples = append(samples, sample{at: start, dur: time.Since(start)})
			mu.Unlock()
			time.Sleep(time.Millisecond)
		}
	}()
	return func() []sample {
		<-done
		mu.Lock()
		defer mu.Unlock()
		return samples
	}
}

func between(s []sample, from, to time.Time) []time.Duration {
	var out []time.Duration
	for _, x := range s {
		if !x.at.Before(from) && x.at.Before(to) {
			out = append(out, x.dur)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func p99(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	i := (len(d)*99+99)/100 - 1
	return d[i]
}

// TestMigrateDoesNotBlockProducers migrates an install at version 1 with a
// full outbox to head while a producer inserts and an application
// transaction that wrote outbox_events stays open for a while: every ALTER
// of outbox_events queues behind that transaction, and without a
// lock_timeout every insert would queue behind the ALTER.
//
// Not parallel: the latencies it compares are the machine's, so it runs
// alone among this package's tests.
func TestMigrateDoesNotBlockProducers(t *testing.T) {
	rows := migrateRows(t)
	db := harness.NewEmptyDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	legacyUp(t, db.URL, 1)

	// Nine in ten done (a document's newest version spread over the outbox),
	// the rest failed or pending; a quarter as many documents as events.
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload, status, processed_at, error_reason, attempts)
		SELECT 'book', (g % $2)::text, CASE WHEN g % 13 = 0 THEN 'delete' ELSE 'upsert' END, g,
		       jsonb_build_object('title', 'book ' || g),
		       CASE WHEN g % 10 = 1 THEN 'failed' WHEN g % 10 = 2 THEN 'pending' ELSE 'done' END,
		       CASE WHEN g % 10 > 2 OR g % 10 = 0 THEN now() - interval '1 hour' END,
		       CASE WHEN g % 10 = 1 THEN 'mapping_error' END, 1
		  FROM generate_series(1, $1) g`, rows, max(rows/4, 1))
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `VACUUM ANALYZE outbox_events`)
	require.NoError(t, err)

	pctx, stopProducer := context.WithCancel(ctx)
	defer stopProducer()
	results := producer(pctx, t, db.URL)
	time.Sleep(2 * time.Second)
	baselineEnd := time.Now()

	// The application's long transaction: it wrote outbox_events, so it
	// holds ROW EXCLUSIVE on it until it ends.
	app, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	defer app.Close(context.Background())
	appTx, err := app.Begin(ctx)
	require.NoError(t, err)
	_, err = appTx.Exec(ctx, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', 'long', 'upsert')`)
	require.NoError(t, err)

	type outcome struct {
		res migrations.Result
		err error
		end time.Time
	}
	migStart := time.Now()
	migDone := make(chan outcome, 1)
	go func() {
		res, err := migrations.Up(ctx, db.URL, migrations.Expect{Database: db.Name})
		migDone <- outcome{res, err, time.Now()}
	}()

	time.Sleep(4 * time.Second)
	require.NoError(t, appTx.Commit(ctx))
	appEnd := time.Now()

	var out outcome
	select {
	case out = <-migDone:
	case <-time.After(8 * time.Minute):
		t.Fatal("migration did not finish 8 minutes after the long transaction ended")
	}
	// The baseline is taken before and after the migration, so that load
	// from elsewhere on the machine weighs on both sides alike.
	time.Sleep(2 * time.Second)
	stopProducer()
	samples := results()

	require.NoError(t, out.err, "the migration succeeds once the long transaction ends")
	require.False(t, out.end.Before(appEnd), "the migration must have waited for the long transaction (it holds a lock every CONCURRENTLY build waits for)")
	var current int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT max(version_id) FROM goose_db_version WHERE is_applied`).Scan(&current))
	require.Equal(t, out.res.Current, current)
	require.GreaterOrEqual(t, current, int64(15))

	base := append(between(samples, time.Time{}, baselineEnd), between(samples, out.end, time.Now())...)
	sort.Slice(base, func(i, j int) bool { return base[i] < base[j] })
	during := between(samples, migStart, out.end)
	require.NotEmpty(t, base)
	require.NotEmpty(t, during)
	t.Logf("rows=%d migration %s (long transaction ended after %s); inserts: baseline n=%d p99=%s, during n=%d p99=%s max=%s",
		rows, out.end.Sub(migStart).Round(time.Millisecond), appEnd.Sub(migStart).Round(time.Millisecond),
		len(base), p99(base), len(during), p99(during), during[len(during)-1])
	require.Less(t, during[len(during)-1], time.Second, "no insert may wait a second or more during the migration")
	// The CONCURRENTLY builds share the CPUs with the producer (and, under
	// go test ./..., with other packages): that alone can double a p99 of
	// half a millisecond, and a loaded machine doubled a 5.7 ms one (CI
	// failed on 13.0 against 11.5). An insert queued behind a lock waits
	// for a lock_timeout try (500 ms) or more, so the floor keeps what this
	// checks, and the maximum above catches a longer wait.
	bound := max(3*p99(base), 20*time.Millisecond)
	require.LessOrEqual(t, p99(during), bound, "p99 insert latency during the migration must stay within 3x the baseline (at least 20 ms)")
}

package e2e

// The database's vacuum horizon under the topology the README documents:
// two replicas under load, a rebuild, a scheduled verify, an operator's
// verify and the console being browsed. No wlproj session may hold a
// snapshot for more than a few seconds, and VACUUM of an application table
// must remove rows deleted a few seconds before it, or wlproj would bloat
// every table of the database it lives in.

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/faultproxy"
	"github.com/wlproj/wlproj/internal/testkit/harness"
)

const (
	// hzSourceRows is large enough, with hzBulk and the proxy's delay,
	// for a load in one snapshot to hold it for several seconds.
	hzSourceRows = 20_000
	hzBulk       = 100
	// hzOldest is the oldest snapshot a wlproj session may hold.
	hzOldest = 3 * time.Second
	// hzSlack is how long after a delete VACUUM must be able to remove
	// the rows: hzOldest and a second for the sampling.
	hzSlack = hzOldest + time.Second
)

// Not parallel: it runs before the package's parallel tests start, so the
// ages it measures are wlproj's and not a CPU shared with a dozen other
// replicas (in CI, alongside them, the console's 12 ms status statement
// was once 3.4 s old; the record now says what a session waited on).
func TestNoSessionHoldsTheHorizon(t *testing.T) {
	ctx := context.Background()
	// A Postgres of its own: on the stack's, other packages' tests hold
	// xids for seconds, which every snapshot taken meanwhile carries into
	// this database's horizon, whoever takes it.
	pg := harness.StartPGAlone(t)
	db := pg.NewDatabase(t, pg.URL([]string{pg.Primary.Addr()}))
	index := harness.NewIndex(t)
	t.Cleanup(func() { _ = harness.DeleteIndex(context.Background(), harness.ElasticURL(t), index+"-*") })
	db.Exec(t, `CREATE TABLE search_index (entity_type text NOT NULL, entity_id text NOT NULL, doc jsonb NOT NULL,
		version bigint NOT NULL, PRIMARY KEY (entity_type, entity_id))`)
	db.Exec(t, `INSERT INTO search_index SELECT 'book', 'b' || g, jsonb_build_object('kind', 'book', 'title', 'Book ' || g), 1
		FROM generate_series(1, $1) g`, hzSourceRows)

	const user, password = "ada", "console-pw"
	sessionKey := filepath.Join(t.TempDir(), "session.key")
	require.NoError(t, os.WriteFile(sessionKey, []byte(harness.UniqueName("session-key-")+harness.UniqueName("-")), 0o600))
	env := harness.ReplicaEnv(db.URL, harness.ElasticURL(t), index, slices.Concat(harness.Quick, []string{
		"OUTBOX_VERIFY_INTERVAL=2s", "OUTBOX_VERIFY_FROM_TABLE=search_index", "OUTBOX_VERIFY_RATE=4000",
		"OUTBOX_CONSOLE_USERS_FILE=" + consoleUsers(t, user, password), "OUTBOX_CONSOLE_SESSION_KEY_FILE=" + sessionKey,
	})...)
	replicas := []*harness.Replica{harness.StartReplica(t, "hz-a", env), harness.StartReplica(t, "hz-b", env)}
	harness.Healthy(t, replicas...)
	harness.Leader(t, replicas...)

	// The first rebuild, in a quiet window, loads the source and makes the
	// index an alias; the one measured below rebuilds it under load.
	rebuild := []string{"rebuild", "--from-table", "search_index", "--by", "e2e", "--why", "horizon test", "--progress", "json"}
	out, err := hzCommand(t, db, harness.ElasticURL(t), index, rebuild...)
	require.NoError(t, err, "first rebuild: %s", out)

	watch := harness.WatchSnapshots(db.Pool, "wlproj", 100*time.Millisecond)
	// Everyone's, for the failure message when a VACUUM round fails.
	everyone := harness.WatchSnapshots(db.Pool, "", 100*time.Millisecond)
	t.Cleanup(func() {
		if oldest, _, _ := everyone.Stop(); t.Failed() {
			t.Logf("the oldest snapshot of any session in the database: %s", oldest)
		}
	})
	producer := harness.Produce(ctx, harness.SourceWriter{DB: db.Pool, Table: "search_index"},
		harness.ProducerConfig{Rate: 200, Next: hzEvents()})
	t.Cleanup(producer.Stop)
	stop := make(chan struct{})
	halt := sync.OnceFunc(func() { close(stop) })
	t.Cleanup(halt) // before the replicas stop
	vacuumed := hzVacuum(t, db, stop)

	// The operator's commands reach the engine through a slow network, so
	// that each holds whatever it holds for seconds.
	slow := faultproxy.Start(t, harness.ElasticURL(t))
	slow.SetDelay(20*time.Millisecond, 0)
	began := time.Now()
	var wg sync.WaitGroup
	outs := make([]string, 2)
	errs := make([]error, 2)
	for i, args := range [][]string{
		append(rebuild, "--bulk-size", fmt.Sprint(hzBulk), "--concurrency", "1"),
		{"verify", "--from-table", "search_index", "--rate", "5000"},
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i], errs[i] = hzCommand(t, db, slow.URL(), index, args...)
		}()
	}
	// An operator browses both consoles until the commands are done.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	consoles := []func(string) string{}
	for _, r := range replicas {
		consoles = append(consoles, consoleSession(t, r, user, password))
	}
	browsed := 0
	for browsing := true; browsing; {
		for _, get := range consoles {
			for _, page := range []string{"", "failed", "archived", "audit"} {
				get(page)
				browsed++
			}
		}
		select {
		case <-done:
			browsing = false
		case <-time.After(200 * time.Millisecond):
		}
	}
	t.Logf("rebuild and verify done %s after the load began; %d console pages read", time.Since(began).Round(time.Millisecond), browsed)
	require.NoError(t, errs[0], "rebuild: %s", outs[0])
	require.NoError(t, errs[1], "verify (exit 0: clean): %s", outs[1])
	harness.Eventually(t, 30*time.Second, "a scheduled verify recorded", func() bool {
		return db.Int(t, `SELECT count(*) FROM outbox_verify_runs`) == 1
	})

	producer.Stop()
	require.NoError(t, producer.Err())
	harness.Drained(t, db.Pool, 60*time.Second)
	halt()
	oldest, samples, err := watch.Stop()
	require.NoError(t, err)
	t.Logf("oldest wlproj snapshot of %d samples: %s", samples, oldest)
	require.Less(t, oldest.Age, hzOldest, "no wlproj session holds a snapshot this long; the oldest: %s", oldest)
	left := <-vacuumed
	require.NotEmpty(t, left, "VACUUM ran while the topology worked")
	for i, n := range left {
		require.Zero(t, n, "VACUUM round %d of %d left rows deleted %s before it: some snapshot held them", i+1, len(left), hzSlack)
	}

	require.Zero(t, db.Int(t, `SELECT missing + stale + extra + resurrected FROM outbox_verify_runs`),
		"the scheduled verify found no drift")
	harness.Verified(t, db.Pool, index)
	harness.SourceMatched(t, db.Pool, index, "search_index")
}

// hzCommand runs the binary as an operator would, against engine.
func hzCommand(t *testing.T, db harness.DB, engine, index string, args ...string) (string, error) {
	cmd := exec.Command(harness.Binary(t), args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+db.URL, "ELASTIC_URL="+engine, "ELASTIC_INDEX="+index)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// hzEvents updates the source's books, adds new ones and deletes some, each
// event a new version, as the application would.
func hzEvents() func(n int) []harness.Event {
	var mu sync.Mutex
	version := int64(10)
	rng := rand.New(rand.NewPCG(3, 4))
	return func(n int) []harness.Event {
		mu.Lock()
		defer mu.Unlock()
		events := make([]harness.Event, n)
		for i := range events {
			version++
			id, op := fmt.Sprintf("b%d", 1+rng.IntN(hzSourceRows)), "upsert"
			switch k := rng.IntN(10); {
			case k == 0:
				id = fmt.Sprintf("new%d", version)
			case k == 1:
				op = "delete"
			}
			payload, _ := json.Marshal(map[string]any{"kind": "book", "title": fmt.Sprintf("v%d", version)})
			events[i] = harness.Event{EntityType: "book", EntityID: id, Op: op, Version: version, Payload: payload}
		}
		return events
	}
}

// hzVacuum deletes the rows of a fresh application table, waits hzSlack,
// and vacuums it, round after round until stop; it sends the rows each
// round could not remove.
func hzVacuum(t *testing.T, db harness.DB, stop <-chan struct{}) <-chan []int64 {
	done := make(chan []int64, 1)
	go func() {
		var left []int64
		defer func() { done <- left }()
		for round := 0; ; round++ {
			rows, err := harness.DeleteRows(context.Background(), db.Pool, fmt.Sprintf("application_rows_%d", round), 1000)
			if err != nil {
				t.Errorf("delete rows: %v", err)
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(hzSlack):
			}
			n, err := rows.Vacuum(context.Background())
			if err != nil {
				t.Errorf("vacuum: %v", err)
				return
			}
			if n > 0 {
				// Whoever it is, wlproj's or not: the failure names it.
				h, held, err := harness.OldestHorizon(context.Background(), db.Pool)
				t.Logf("VACUUM round %d left %d rows; the oldest holder of the horizon: %+v (held %v, %v)", round+1, n, h, held, err)
				var cluster string
				_ = db.Pool.QueryRow(context.Background(), `SELECT coalesce(string_agg(format('%s %s %s xmin-age %s xact %s %s', datname, application_name,
					state, age(backend_xmin), now() - xact_start, left(query, 60)), E'\n'), '') FROM (SELECT * FROM pg_stat_activity
					WHERE backend_xmin IS NOT NULL ORDER BY age(backend_xmin) DESC LIMIT 5) a`).Scan(&cluster)
				t.Logf("the cluster's oldest:\n%s", cluster)
				t.Logf("VACUUM VERBOSE says: %s", vacuumVerbose(db, fmt.Sprintf("application_rows_%d", round)))
			}
			left = append(left, n)
		}
	}()
	return done
}

// vacuumVerbose runs VACUUM (VERBOSE) on table and returns what it said,
// for a failure message: its removable cutoff says which xid held it.
func vacuumVerbose(db harness.DB, table string) string {
	cfg, err := pgx.ParseConfig(db.URL)
	if err != nil {
		return err.Error()
	}
	var said []string
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { said = append(said, n.Message) }
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		return err.Error()
	}
	defer conn.Close(context.Background())
	var prepared string
	_ = conn.QueryRow(context.Background(), `SELECT coalesce(string_agg(format('%s %s %s', gid, database, transaction), '; '), 'none') FROM pg_prepared_xacts`).Scan(&prepared)
	var slots string
	_ = conn.QueryRow(context.Background(), `SELECT coalesce(string_agg(format('%s %s %s', slot_name, xmin, catalog_xmin), '; '), 'none') FROM pg_replication_slots`).Scan(&slots)
	if _, err := conn.Exec(context.Background(), `VACUUM (VERBOSE) `+pgx.Identifier{table}.Sanitize()); err != nil {
		return err.Error()
	}
	return strings.Join(said, "\n") + "\nprepared: " + prepared + "\nslots: " + slots
}

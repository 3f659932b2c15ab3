package consume

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
	"github.com/wlproj/wlproj/replay"
)

// The model test: random per-document histories (good upserts, upserts the
// strict mapping refuses, deletes, out-of-order and reused versions, null
// versions), written in random chunks between random batches, with
// concurrent flights, acks that fail with batches in flight (a rewind, and
// reads again of rows earlier batches still hold), producers that write
// xid, rotations with a retention of 0 as the runtime role, leaders killed
// between their bulk and its ack, a
// deposed leader's bulk delivered late, replays, discards, pruning, late
// commits, pauses and resumes, and repair events (verify --repair's: an
// upsert or a delete at the version the ledger holds) in between; in some
// seeds the database is copied into another cluster half way (pg_dump
// into a fresh initdb, whose transaction counter is behind) and the
// history goes on there after the operator's rebase (model_move_test.go). After
// the run the index must equal the model: each document at its newest
// applicable event, a repair upsert counting as the newest of its version,
// a repair delete never undoing a live document; gone after a delete;
// after the mapping is fixed and the failed events replayed, at its newest
// event of all. Two latest-only projections, search and shelf, each on an
// index of its own, share document ids: each (projection, document) is a
// document of its own, with its own versions and ledger entry.
//
// WLPROJ_MODEL_SEED=n runs that seed alone (a failing seed is printed);
// WLPROJ_MODEL_SEEDS=n runs n seeds from a random start, as `make drill`
// does; WLPROJ_MODEL_DOCS sets the documents per seed; WLPROJ_MODEL_MOVE=1
// moves the database in every seed.
func TestModelRandomHistories(t *testing.T) {
	seeds, docs := modelSeeds(t)
	for _, seed := range seeds {
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) {
			t.Parallel()
			t.Logf("seed %d (WLPROJ_MODEL_SEED=%d reproduces it)", seed, seed)
			newModel(t, seed, docs).run(t)
		})
	}
}

// modelFastSeeds run in `make test`; a seed that ever failed joins them.
var modelFastSeeds = []uint64{1, 2, 3, 4}

func modelSeeds(t *testing.T) ([]uint64, int) {
	t.Helper()
	docs := 40
	if v := os.Getenv("WLPROJ_MODEL_DOCS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, "WLPROJ_MODEL_DOCS")
		docs = n
	}
	if v := os.Getenv("WLPROJ_MODEL_SEED"); v != "" {
		seed, err := strconv.ParseUint(v, 10, 64)
		require.NoError(t, err, "WLPROJ_MODEL_SEED")
		return []uint64{seed}, docs
	}
	if v := os.Getenv("WLPROJ_MODEL_SEEDS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, "WLPROJ_MODEL_SEEDS")
		start := uint64(time.Now().UnixNano() % 1_000_000_000)
		seeds := make([]uint64, n)
		for i := range seeds {
			seeds[i] = start + uint64(i)
		}
		return seeds, docs
	}
	return modelFastSeeds, docs
}

// mEvent is one event of the model, and what became of its row.
type mEvent struct {
	proj    string // modelProjections
	entity  string
	op      string
	version *int64 // nil: the outbox id orders it
	title   string
	refused bool // the strict mapping refuses it until the fix
	twin    bool // reuses the version of another event, with the same content
	repair  bool // verify --repair's, at the version the ledger held
	id      int64
	// discarded by the test's operator.
	discarded bool
}

// payload is the event's payload: a refused upsert's has a field the
// strict mapping does not know.
func (e mEvent) payload() string {
	switch {
	case e.op != outbox.OpUpsert:
		return "{}"
	case e.refused:
		return fmt.Sprintf(`{"kind":"book","title":%q,"isbn":"x"}`, e.title)
	}
	return fmt.Sprintf(`{"kind":"book","title":%q}`, e.title)
}

func (e mEvent) order() int64 {
	if e.version != nil {
		return *e.version
	}
	return e.id
}

// modelProjections are the model's two latest-only projections.
var modelProjections = []string{"search", "shelf"}

// key names a document of a projection.
func key(proj, entity string) string { return proj + "/" + entity }

type model struct {
	rng   *rand.Rand
	b     bundle
	roles runtimeRoles
	// moveAt is how many events are still to be written when the database
	// moves to another cluster, -1 if it does not (modelMoveAt).
	moveAt int
	base   string
	// index and h are each projection's index and handler.
	index  map[string]string
	h      map[string]*modelHandler
	events []*mEvent // in insert order once inserted
	queue  []*mEvent // not yet inserted
	byID   map[int64]*mEvent
	// doneBeforePrune holds the events done when a rotation ran: only
	// their rows may be gone.
	doneBeforePrune map[int64]bool

	epoch int64
	loop  *Loop
	late  []outbox.Event // a deposed leader's bulk, held in the network
	log   []string
	// repaired are the documents' versions a repair event was queued at:
	// one each, as a verify queues one per document it judges.
	repaired map[string]bool
	// horizon is an outside REPEATABLE READ transaction holding the vacuum
	// horizon (a report, a pg_dump) while it is open.
	horizon pgx.Tx
}

// modelHandler is the search handler as a leader runs it, which the test can
// kill between the bulk and its ack, or whose bulk it can hold back.
type modelHandler struct {
	search *projection.Search
	mu     sync.Mutex
	mode   string // "", "kill" (bulk sent, then the leader dies) or "hold" (bulk held, then the leader dies)
	kill   context.CancelFunc
	held   []outbox.Event
}

func (h *modelHandler) LatestOnly() bool { return true }

func (h *modelHandler) Handle(ctx context.Context, events []outbox.Event) []projection.Result {
	h.mu.Lock()
	mode, kill := h.mode, h.kill
	h.mu.Unlock()
	switch mode {
	case "kill":
		results := h.search.Handle(ctx, events)
		kill()
		return results
	case "hold":
		h.mu.Lock()
		h.held = append(h.held, events...)
		h.mu.Unlock()
		kill()
		results := make([]projection.Result, len(events))
		for i, e := range events {
			results[i] = projection.Result{ID: e.ID, Err: context.Canceled}
		}
		return results
	}
	return h.search.Handle(ctx, events)
}

func newModel(t *testing.T, seed uint64, docs int) *model {
	t.Helper()
	// The loop and the rotations run as roles.sql's runtime role, as
	// `wlproj run` does; producers and the operator use the admin's pool.
	m := &model{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		base: harness.ElasticURL(t), index: map[string]string{}, h: map[string]*modelHandler{}, byID: map[int64]*mEvent{}, epoch: 1,
		doneBeforePrune: map[int64]bool{},
		repaired:        map[string]bool{}}
	m.b, m.roles = setupRuntimeRoles(t)
	client, err := projection.NewElasticClient(projection.ElasticOptions{URL: m.base})
	require.NoError(t, err)
	for i, proj := range modelProjections {
		m.index[proj] = harness.NewIndex(t)
		// The second projection sends its share of a batch in small bulks,
		// several at once (a projections file's bulk:), so the histories
		// also run through requests that overlap and finish in any order.
		cfg := projection.SearchConfig{Client: client, Index: m.index[proj]}
		if i == 1 {
			cfg.BulkActions, cfg.BulkConcurrency = 1+m.rng.IntN(4), 3
		}
		search, err := projection.NewSearch(cfg)
		require.NoError(t, err)
		m.h[proj] = &modelHandler{search: search}
	}
	refuseLedger(t, m.b)
	m.newLeader(t)
	m.queue = m.histories(docs)
	m.moveAt = modelMoveAt(seed, len(m.queue))
	return m
}

// histories makes each document's events, then interleaves the documents.
func (m *model) histories(docs int) []*mEvent {
	var perDoc [][]*mEvent
	for d := range docs {
		entity := "m" + strconv.Itoa(d)
		perDoc = append(perDoc, m.history("search", entity))
		if m.rng.IntN(2) == 0 {
			perDoc = append(perDoc, m.history("shelf", entity))
		}
	}
	var out []*mEvent
	for len(perDoc) > 0 {
		i := m.rng.IntN(len(perDoc))
		out = append(out, perDoc[i][0])
		if perDoc[i] = perDoc[i][1:]; len(perDoc[i]) == 0 {
			perDoc = slices.Delete(perDoc, i, i+1)
		}
	}
	return out
}

// history makes one document's events of one projection.
func (m *model) history(proj, entity string) []*mEvent {
	n := 2 + m.rng.IntN(5)
	nullVersions := m.rng.IntN(5) == 0
	var evs []*mEvent
	for k := range n {
		e := &mEvent{proj: proj, entity: entity, title: fmt.Sprintf("%s-%s-e%d", proj, entity, k)}
		switch r := m.rng.IntN(100); {
		case r < 25:
			e.op = outbox.OpDelete
		case r < 45:
			e.op, e.refused = outbox.OpUpsert, true
		default:
			e.op = outbox.OpUpsert
		}
		if !nullVersions {
			v := int64(k + 1)
			e.version = &v
		}
		evs = append(evs, e)
	}
	if !nullVersions {
		if m.rng.IntN(2) == 0 {
			m.rng.Shuffle(len(evs), func(i, j int) { evs[i], evs[j] = evs[j], evs[i] })
		}
		// A producer re-emitting an event: same version, same content.
		for _, e := range evs {
			if e.op == outbox.OpUpsert && !e.refused && m.rng.IntN(8) == 0 {
				twin := *e
				twin.twin = true
				evs = append(evs, &twin)
				break
			}
		}
	}
	return evs
}

func (m *model) logf(format string, args ...any) { m.log = append(m.log, fmt.Sprintf(format, args...)) }

func (m *model) newLeader(t *testing.T) {
	t.Helper()
	m.b.Lead(t, m.epoch)
	var err error
	m.loop, err = NewLoop(Config{BulkSize: 1 + m.rng.IntN(8), MaxAttempts: 50}, m.b.Store,
		projection.Registry{"search": m.h["search"], "shelf": m.h["shelf"]}, zerolog.Nop())
	require.NoError(t, err)
	m.logf("epoch %d, bulk size %d", m.epoch, m.loop.cfg.BulkSize)
}

func (m *model) run(t *testing.T) {
	t.Helper()
	defer func() {
		if t.Failed() {
			t.Logf("steps:\n%s", joinLines(m.log))
		}
	}()
	ctx := context.Background()
	// A history whose events stop being settled (a position that passes
	// nothing, a row no claim takes) fails with its steps instead of
	// running into go test's timeout.
	maxSteps := 1000 + 5*len(m.queue)
	for step := 0; len(m.queue) > 0 || m.busy(t) || m.moveAt >= 0; step++ {
		if step == maxSteps {
			t.Fatalf("still busy after %d steps: %v", step, harness.Column[string](t, m.b.DB, `SELECT id || ' ' || status FROM outbox_event_states
				WHERE status IN ('pending', 'processing') ORDER BY id LIMIT 20`))
		}
		if len(m.queue) <= m.moveAt {
			m.move(t, ctx)
		}
		if len(m.queue) > 0 && m.rng.IntN(3) > 0 {
			m.insert(t, 1+m.rng.IntN(12))
		}
		switch r := m.rng.IntN(100); {
		case r < 51:
			m.round(t, ctx)
		case r < 55:
			m.repairSome(t)
		case r < 60:
			m.concurrentRounds(t, ctx)
		case r < 63:
			m.rewindRounds(t, ctx)
		case r < 70:
			m.killedRound(t, "kill")
		case r < 75:
			if m.late == nil {
				m.killedRound(t, "hold")
			}
		case r < 80:
			m.deliverLate(t)
		case r < 85:
			m.replaySome(t)
		case r < 89:
			m.discardSome(t)
		case r < 92:
			m.prune(t)
		case r < 95:
			m.lateCommit(t, ctx)
		case r < 96:
			m.pauseResume(t, ctx)
		case r < 97:
			m.holdHorizon(t, ctx)
		default:
			m.timePasses(t)
		}
	}
	m.deliverLate(t)
	if m.horizon != nil {
		m.holdHorizon(t, ctx)
	}
	m.check(t, false)

	// The mapping is fixed and every failed event replayed: now each
	// document ends at its newest event of all.
	for _, index := range m.index {
		require.NoError(t, harness.ES(ctx, m.base, http.MethodPut, "/"+index+"/_mapping",
			[]byte(`{"properties":{"isbn":{"type":"keyword"}}}`), nil))
	}
	_, err := replay.Replay(ctx, m.b.Pool, replay.Request{Reason: "mapping_error", By: "model", Why: "mapping fixed", Yes: true})
	require.NoError(t, err)
	m.logf("mapping fixed, failed events replayed")
	for m.busy(t) {
		m.round(t, ctx)
	}
	m.check(t, true)
}

func joinLines(lines []string) string {
	out := ""
	for _, l := range lines {
		out += "  " + l + "\n"
	}
	return out
}

func (m *model) insert(t *testing.T, n int) {
	t.Helper()
	tx, err := m.b.Pool.Begin(context.Background())
	require.NoError(t, err)
	defer tx.Rollback(context.Background()) //nolint:errcheck
	m.insertIn(t, tx, n)
	require.NoError(t, tx.Commit(context.Background()))
}

// insertIn inserts the next n events of the queue in tx.
func (m *model) insertIn(t *testing.T, tx pgx.Tx, n int) {
	t.Helper()
	n = min(n, len(m.queue))
	if n == 0 {
		return
	}
	chunk := m.queue[:n]
	m.queue = m.queue[n:]
	for _, e := range chunk {
		// A producer may write xid itself, null or copied from an older
		// row: the column is wlproj's, and each must be read as any other.
		xid := []string{"", ", NULL", ", (SELECT min(xid) FROM outbox_events)"}[max(0, m.rng.IntN(12)-9)]
		cols := map[bool]string{true: ", xid"}[xid != ""]
		require.NoError(t, tx.QueryRow(context.Background(), `
			INSERT INTO outbox_events (projection, entity_type, entity_id, op, event_version, payload`+cols+`)
			VALUES ($5, 'book', $1, $2, $3, $4`+xid+`) RETURNING id`, e.entity, e.op, e.version, e.payload(), e.proj).Scan(&e.id))
		m.byID[e.id] = e
		m.events = append(m.events, e)
	}
	m.logf("inserted %d events up to id %d", n, chunk[n-1].id)
}

// lateCommit inserts events in a transaction that commits only after a
// later transaction's events were claimed: they fall due behind the claim
// cursor, where only a claim from the head finds them.
func (m *model) lateCommit(t *testing.T, ctx context.Context) {
	t.Helper()
	if len(m.queue) < 2 {
		return
	}
	tx, err := m.b.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	m.insertIn(t, tx, 1+m.rng.IntN(min(len(m.queue)-1, 20)))
	m.insert(t, 1+m.rng.IntN(4))
	m.round(t, ctx)
	require.NoError(t, tx.Commit(ctx))
	m.logf("the first of those transactions committed late")
}

// pauseResume pauses the projections, lets a round find nothing of them, and
// resumes it, asking the loop for a claim from the head as the resume's
// NOTIFY does.
func (m *model) pauseResume(t *testing.T, ctx context.Context) {
	t.Helper()
	setPaused := func(paused bool) {
		for _, proj := range modelProjections {
			_, err := outbox.SetPaused(ctx, m.b.Pool, outbox.PauseRequest{Projection: proj, Paused: paused, By: "model", Why: "model",
				Known: modelProjections})
			require.NoError(t, err)
		}
	}
	setPaused(true)
	m.insert(t, 1+m.rng.IntN(12))
	res, err := m.loop.runOnce(ctx, m.epoch)
	require.NoError(t, err)
	require.Equal(t, BatchResult{}, res, "a paused projection's events are not claimed")
	setPaused(false)
	m.loop.headWanted.Store(true)
	m.logf("paused, a round claimed nothing, resumed")
}

// repairSome queues repair events, as verify --repair does, for a few
// documents the ledger holds: at the ledger's version, a delete, or an
// upsert of new content that the mapping may refuse. A repair upsert
// rewrites its version; a repair delete of a live document must change
// nothing (the verify that queued it judged on reads the ledger has moved
// past). None while a deposed leader's bulk is held: its write of the
// repair's version, delivered after the repair, would undo it, as any
// write of one version may under external_gte; the write-lifetime bound
// keeps such late writes far shorter than a verify's cycle.
func (m *model) repairSome(t *testing.T) {
	t.Helper()
	if m.late != nil {
		return
	}
	ledger := m.ledger(t)
	entities := slices.Sorted(maps.Keys(ledger))
	m.rng.Shuffle(len(entities), func(i, j int) { entities[i], entities[j] = entities[j], entities[i] })
	var queued []string
	for _, doc := range entities[:min(len(entities), 1+m.rng.IntN(3))] {
		l := ledger[doc]
		v := l.Version
		proj, entity, _ := strings.Cut(doc, "/")
		if at := fmt.Sprintf("%s@%d", doc, v); !m.repaired[at] {
			m.repaired[at] = true
			e := &mEvent{proj: proj, entity: entity, op: outbox.OpDelete, version: &v, title: fmt.Sprintf("%s-repair-v%d", doc, v), repair: true}
			if !l.Deleted && m.rng.IntN(3) > 0 {
				e.op, e.refused = outbox.OpUpsert, m.rng.IntN(4) == 0
			}
			require.NoError(t, m.b.Pool.QueryRow(context.Background(), `
				INSERT INTO outbox_events (projection, entity_type, entity_id, op, event_version, payload, repair)
				VALUES ($5, 'book', $1, $2, $3, $4, true) RETURNING id`, e.entity, e.op, e.version, e.payload(), e.proj).Scan(&e.id))
			m.byID[e.id] = e
			m.events = append(m.events, e)
			queued = append(queued, fmt.Sprintf("%d %s %s v%d refused=%v (ledger deleted=%v)", e.id, doc, e.op, v, e.refused, l.Deleted))
		}
	}
	m.logf("repairs queued: %v", queued)
}

func (m *model) round(t *testing.T, ctx context.Context) {
	t.Helper()
	res, err := m.loop.runOnce(ctx, m.epoch)
	require.NoError(t, err)
	m.logf("round: %+v", res)
}

// concurrentRounds claims up to three batches ahead and processes them at
// once, the later ones started first, as the pipelined loop can.
func (m *model) concurrentRounds(t *testing.T, ctx context.Context) {
	t.Helper()
	flights := m.claimAhead(t, ctx, nil, 2+m.rng.IntN(2))
	m.handleAll(ctx, flights, nil)
	m.logf("%d concurrent flights", len(flights))
}

// handleAll processes flights at once, the later ones started first, but
// done (handled already), then checkpoints.
func (m *model) handleAll(ctx context.Context, flights []*flight, done *flight) {
	var wg sync.WaitGroup
	for i := len(flights) - 1; i >= 0; i-- {
		if flights[i] == done {
			continue
		}
		wg.Go(func() { _, _ = m.loop.handle(ctx, m.epoch, flights[i]) })
	}
	wg.Wait()
	m.loop.checkpoint(ctx, m.epoch, true)
}

// claimAhead claims up to n more batches after flights, as the pipelined
// loop claims ahead of its bulks.
func (m *model) claimAhead(t *testing.T, ctx context.Context, flights []*flight, n int) []*flight {
	t.Helper()
	for range n {
		f, err := m.loop.claim(ctx, m.epoch)
		require.NoError(t, err)
		if f == nil {
			break
		}
		flights = append(flights, f)
	}
	return flights
}

// rewindRounds claims two or three batches ahead, fails the ack of one of
// them (its ledger write is refused, as a dropped connection or a timeout
// would fail it), which rewinds its projection's reads; then claims again
// (the reads again, which may start at a row an earlier batch still holds)
// and processes every batch at once, the later ones started first.
func (m *model) rewindRounds(t *testing.T, ctx context.Context) {
	t.Helper()
	flights := m.claimAhead(t, ctx, nil, 2+m.rng.IntN(2))
	if len(flights) == 0 {
		return
	}
	// The failing batch is handled first, alone: one that waits for an
	// earlier batch of one of its documents (order) cannot be.
	var free []*flight
	for _, f := range flights {
		if len(f.after) == 0 {
			free = append(free, f)
		}
	}
	failing := free[m.rng.IntN(len(free))]
	ids := make([]int64, len(failing.events))
	for i, e := range failing.events {
		ids[i] = e.ID
	}
	m.b.Exec(t, `INSERT INTO model_refuse SELECT unnest($1::bigint[])`, ids)
	res, err := m.loop.handle(ctx, m.epoch, failing)
	require.NoError(t, err)
	m.b.Exec(t, `DELETE FROM model_refuse`)
	flights = m.claimAhead(t, ctx, flights, 1+m.rng.IntN(2))
	m.handleAll(ctx, flights, failing)
	m.logf("%d flights, one's ack failed (%+v), then read again", len(flights), res)
}

// refuseLedger makes the ledger refuse the entries of the events listed
// in model_refuse: an ack that writes one fails as a whole.
func refuseLedger(t *testing.T, b bundle) {
	t.Helper()
	b.Exec(t, `CREATE TABLE model_refuse (event_id bigint PRIMARY KEY)`)
	b.Exec(t, `GRANT SELECT ON model_refuse TO PUBLIC`) // the trigger runs as the inserting role
	b.Exec(t, `CREATE FUNCTION model_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
	           BEGIN IF EXISTS (SELECT 1 FROM model_refuse WHERE event_id = NEW.event_id) THEN
	             RAISE EXCEPTION 'the model refuses this ack'; END IF; RETURN NEW; END $$`)
	b.Exec(t, `CREATE TRIGGER model_refuse BEFORE INSERT ON outbox_ledger FOR EACH ROW EXECUTE FUNCTION model_refuse()`)
}

// killedRound is a leader killed -9 after its bulk was sent ("kill") or
// while it is held in the network ("hold"), before any ack: a new leader is
// elected and reclaims the rows.
func (m *model) killedRound(t *testing.T, mode string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, h := range m.h {
		h.mu.Lock()
		h.mode, h.kill, h.held = mode, cancel, nil
		h.mu.Unlock()
	}
	_, err := m.loop.runOnce(ctx, m.epoch)
	var held []outbox.Event
	for _, proj := range modelProjections {
		h := m.h[proj]
		h.mu.Lock()
		held = append(held, h.held...)
		h.mode, h.kill, h.held = "", nil, nil
		h.mu.Unlock()
	}
	if err != nil {
		require.ErrorIs(t, err, context.Canceled)
	}
	if mode == "hold" && len(held) > 0 {
		m.late = held
	}
	m.epoch++
	m.newLeader(t)
	rec := NewReclaimer(m.loop.cfg, m.b.Store, zerolog.Nop())
	res, err := rec.runOnce(context.Background(), m.epoch)
	require.NoError(t, err)
	m.logf("leader killed (%s, %d held); reclaimed %d", mode, len(held), len(res.Pending)+len(res.Failed))
}

// deliverLate lets the deposed leader's held bulk reach the engine now,
// within the write-lifetime bound: the engine still remembers its deletes.
func (m *model) deliverLate(t *testing.T) {
	t.Helper()
	if m.late == nil {
		return
	}
	for _, proj := range modelProjections {
		var mine []outbox.Event
		for _, e := range m.late {
			if e.Projection == proj {
				mine = append(mine, e)
			}
		}
		if len(mine) > 0 {
			m.h[proj].search.Handle(context.Background(), mine)
		}
	}
	m.logf("late bulk of %d events delivered", len(m.late))
	m.late = nil
}

func (m *model) failedIDs(t *testing.T) []int64 {
	t.Helper()
	return harness.Column[int64](t, m.b.DB, `SELECT id FROM outbox_events WHERE status = 'failed' ORDER BY id`)
}

func (m *model) pick(ids []int64) []int64 {
	m.rng.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
	return ids[:m.rng.IntN(len(ids)+1)]
}

func (m *model) replaySome(t *testing.T) {
	t.Helper()
	ids := m.pick(m.failedIDs(t))
	if len(ids) == 0 {
		return
	}
	_, err := replay.Replay(context.Background(), m.b.Pool, replay.Request{IDs: ids, By: "model", Why: "random replay"})
	require.NoError(t, err)
	m.logf("replayed %v", ids)
}

func (m *model) discardSome(t *testing.T) {
	t.Helper()
	ids := m.pick(m.failedIDs(t))
	if len(ids) == 0 {
		return
	}
	_, err := replay.Discard(context.Background(), m.b.Pool, replay.Request{IDs: ids, By: "model", Why: "random discard"})
	require.NoError(t, err)
	for _, id := range ids {
		m.byID[id].discarded = true
	}
	m.logf("discarded %v", ids)
}

// prune runs the outbox's rotation and the ledger's through all their
// partitions with a retention of 0, as retentions that ran out would: done
// rows go with their partitions, rows still needed are moved (a rotation
// held by an event in flight or not yet passed waits, as in production),
// every live entry no event can reopen goes; tombstones stay, as their own
// window (days) keeps them.
func (m *model) prune(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	for _, id := range harness.Column[int64](t, m.b.DB, `SELECT id FROM outbox_event_states WHERE status = 'done'`) {
		m.doneBeforePrune[id] = true
	}
	var events, carried int64
	var held []string
	for range 3 {
		e, err := m.b.Store.RotateEvents(ctx, m.epoch, 0, 10_000)
		require.NoError(t, err)
		events += e.Carried
		if e.Held != "" {
			held = append(held, e.Held)
		}
		r, err := m.b.Store.RotateLedger(ctx, m.epoch, 0, 24*time.Hour, 10_000)
		require.NoError(t, err)
		require.True(t, r.Rotated, "a retention of 0 rotates at once")
		carried += r.Carried
	}
	m.logf("the outbox rotated (%d rows moved, held by %v), the ledger rotated thrice (%d entries carried)", events, held, carried)
}

// timePasses makes the engine forget its deletes, as gc_deletes does; never
// while a late bulk is held: the write-lifetime bound keeps every write of
// wlproj's below gc_deletes.
func (m *model) timePasses(t *testing.T) {
	t.Helper()
	if m.late != nil {
		return
	}
	for _, proj := range modelProjections {
		harness.DeletesForgotten(t, m.index[proj])
	}
	m.logf("the engine forgot its deletes")
}

// check compares the index, the rows and the ledger with the model. Before
// the fix, refused upserts are not applicable; after it, they are.
func (m *model) check(t *testing.T, fixed bool) {
	t.Helper()
	rows := harness.Pairs[int64, string](t, m.b.DB, `SELECT id, status || ':' || coalesce(error_reason, '') FROM outbox_event_states`)
	for _, e := range m.events {
		got, ok := rows[e.id]
		if !ok {
			// Only a row done when a rotation ran may have gone with its
			// partition.
			if !m.doneBeforePrune[e.id] {
				t.Errorf("event %d (%s %s v%v) is gone, and was not done when the outbox rotated", e.id, key(e.proj, e.entity), e.op, e.order())
			}
			continue
		}
		switch {
		case strings.HasPrefix(got, "done:") || (e.discarded && got == "discarded:mapping_error") || (e.discarded && got == "discarded:version_reused"):
		case e.refused && !fixed && got == "failed:mapping_error":
		case e.twin && got == "failed:version_reused":
		case !e.twin && e.version != nil && got == "failed:version_reused" && m.hasTwin(e):
		default:
			t.Errorf("event %d (%s %s v%v refused=%v twin=%v repair=%v discarded=%v) ended %q", e.id, key(e.proj, e.entity), e.op,
				e.order(), e.refused, e.twin, e.repair, e.discarded, got)
		}
	}
	reused := map[int64]bool{}
	for id, got := range rows {
		if got == "failed:version_reused" || got == "discarded:version_reused" {
			reused[id] = true
		}
	}
	want := map[string]*mEvent{}
	for _, e := range m.events {
		// A repair delete is queued at the ledger's version: of a deleted
		// document it changes nothing, of a live one it must not.
		if e.discarded || reused[e.id] || (e.refused && !fixed) || (e.repair && e.op == outbox.OpDelete) {
			continue
		}
		k := key(e.proj, e.entity)
		if w := want[k]; w == nil || e.order() > w.order() || (e.order() == w.order() && e.id > w.id) {
			want[k] = e
		}
	}
	docs := map[string]mDoc{}
	for _, proj := range modelProjections {
		maps.Copy(docs, m.documents(t, proj))
	}
	ledger := m.ledger(t)
	m.checkDocuments(t, want, docs, ledger)
}

// checkDocuments compares each document (key(projection, entity)) of the
// indexes and its ledger entry with its newest applicable event, want.
func (m *model) checkDocuments(t *testing.T, want map[string]*mEvent, docs map[string]mDoc, ledger map[string]outbox.Applied) {
	t.Helper()
	for id, w := range want {
		got, present := docs[id]
		if w.op == outbox.OpDelete {
			if present {
				t.Errorf("%s: resurrected at v%d (%s); newest applicable is delete v%d (event %d)", id, got.version, got.title, w.order(), w.id)
			}
			if l, ok := ledger[id]; !ok || !l.Deleted || l.Version != w.order() {
				t.Errorf("%s: ledger %+v (present %v), want deleted at v%d (event %d); rows %v", id, l, ok, w.order(), w.id,
					harness.Column[string](t, m.b.DB, `SELECT id || ' ' || op || ' v' || coalesce(event_version, id) || ' ' || status || ' ' || coalesce(error_reason, '') FROM outbox_event_states WHERE projection = $1 AND entity_id = $2 ORDER BY id`, w.proj, w.entity))
			}
			continue
		}
		switch {
		case !present:
			t.Errorf("%s: missing; want v%d %q (event %d)", id, w.order(), w.title, w.id)
		case got.version != w.order() || got.title != w.title:
			t.Errorf("%s: at v%d %q; want v%d %q (event %d)", id, got.version, got.title, w.order(), w.title, w.id)
		}
		if l, ok := ledger[id]; ok && (l.Deleted || l.Version != w.order()) {
			t.Errorf("%s: ledger %+v, want live at v%d", id, l, w.order())
		}
	}
	for id := range docs {
		if _, ok := want[id]; !ok {
			t.Errorf("%s: in the index, but no applicable event of it", id)
		}
	}
}

func (m *model) hasTwin(e *mEvent) bool {
	for _, o := range m.events {
		if o != e && o.proj == e.proj && o.entity == e.entity && o.version != nil && *o.version == *e.version {
			return true
		}
	}
	return false
}

type mDoc struct {
	version int64
	title   string
}

// documents are the documents of proj's index, by key(proj, entity).
func (m *model) documents(t *testing.T, proj string) map[string]mDoc {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, harness.ES(ctx, m.base, http.MethodPost, "/"+m.index[proj]+"/_refresh", nil, nil))
	var out struct {
		Hits struct {
			Hits []struct {
				ID      string `json:"_id"`
				Version int64  `json:"_version"`
				Source  struct {
					Title string `json:"title"`
				} `json:"_source"`
			} `json:"hits"`
		} `json:"hits"`
	}
	require.NoError(t, harness.ES(ctx, m.base, http.MethodPost, "/"+m.index[proj]+"/_search",
		[]byte(`{"size": 10000, "version": true}`), &out))
	docs := map[string]mDoc{}
	for _, h := range out.Hits.Hits {
		if entity, ok := strings.CutPrefix(h.ID, "book:"); ok {
			docs[key(proj, entity)] = mDoc{version: h.Version, title: h.Source.Title}
		}
	}
	return docs
}

func (m *model) ledger(t *testing.T) map[string]outbox.Applied {
	t.Helper()
	// The entry the leader reads (outbox_ledger_entry: the newest partition
	// holding the document) must be the newest of all partitions (the
	// view): entries are written in order (migration 00029).
	rows, err := m.b.Pool.Query(context.Background(), `SELECT v.projection || '/' || v.entity_id, v.version, v.event_id, v.deleted,
		a.version, a.event_id FROM outbox_ledger_entries v
		CROSS JOIN LATERAL outbox_ledger_entry(v.projection, v.entity_type, v.entity_id) a`)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]outbox.Applied{}
	for rows.Next() {
		var entity string
		var a outbox.Applied
		var readVersion, readEventID int64
		require.NoError(t, rows.Scan(&entity, &a.Version, &a.EventID, &a.Deleted, &readVersion, &readEventID))
		if readVersion != a.Version || readEventID != a.EventID {
			t.Errorf("%s: the lookup reads (%d, %d) from the newest partition holding it, the newest entry is (%d, %d)",
				entity, readVersion, readEventID, a.Version, a.EventID)
		}
		out[entity] = a
	}
	require.NoError(t, rows.Err())
	return out
}

// busy reports whether any event is pending or processing, queued or
// claimed.
func (m *model) busy(t *testing.T) bool {
	t.Helper()
	return len(harness.Column[int64](t, m.b.DB,
		`SELECT id FROM outbox_event_states WHERE status IN ('pending', 'processing') LIMIT 1`)) > 0
}

// holdHorizon opens an outside REPEATABLE READ transaction that reads the
// outbox, or ends the one open: while it is open nothing any step deletes
// or updates can be vacuumed, and rows committed after it stay invisible
// to it.
func (m *model) holdHorizon(t *testing.T, ctx context.Context) {
	t.Helper()
	if m.horizon != nil {
		require.NoError(t, m.horizon.Rollback(ctx))
		m.horizon = nil
		m.logf("the outside transaction holding the horizon ended")
		return
	}
	tx, err := m.b.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT count(*) FROM outbox_events`)
	require.NoError(t, err)
	m.horizon = tx
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	m.logf("an outside transaction holds the horizon")
}

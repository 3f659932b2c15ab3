package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/replay"
)

// stories are the replay scenario's books. Each starts with an upsert the
// strict mapping refuses (it has an isbn); once it has failed, its book is
// deleted, or upserted at a newer version, or left alone. The
// deleted-unversioned books have no event_version at all: the outbox id
// orders their upsert and delete. When the engine has forgotten the deletes and the mapping is fixed, the
// failed rows are replayed. The ledger must drop every one but the
// left-alone ones unsent; the engine alone would bring the deleted books
// back.
var stories = []struct {
	name      string
	versioned bool
	then      string // the op written once the upsert has failed; none if empty
}{
	{"deleted", true, "delete"},
	{"deleted-unversioned", false, "delete"},
	{"overwritten", true, "upsert"},
	{"left-alone", true, ""},
}

// seedBook is one book of the replay scenario: its story, its refused
// upsert and the event written after it, zero if none.
type seedBook struct {
	id        string
	versioned bool
	thenOp    string
	failed    int64
	then      int64
}

// ledgerWant is the event the book's ledger entry must name in the end.
func (b seedBook) ledgerWant() int64 {
	if b.then != 0 {
		return b.then
	}
	return b.failed
}

// mappingFixField is the field the refused upserts carry and
// testdata/mapping.json lacks; mappingFix adds it to the index.
const (
	mappingFixField = "isbn"
	mappingFix      = `{"properties": {"isbn": {"type": "keyword"}}}`
)

const seedSQL = `
INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload)
VALUES ('book', $1, $2, $3, $4) RETURNING id`

// seed writes the stories' refused upserts, waits until each has failed,
// then writes what comes after and waits until that is done.
func (d *drill) seed(ctx context.Context) error {
	pool := d.s.DB.Pool
	var books []seedBook
	var failed []int64
	for _, st := range stories {
		for k := range d.cfg.Replays {
			b := seedBook{id: "r-" + st.name + "-" + strconv.Itoa(k), versioned: st.versioned, thenOp: st.then}
			doc := book(b.id, "refused", "lib-r", 1, "")
			doc[mappingFixField] = "978-0441013593"
			if err := pool.QueryRow(ctx, seedSQL, b.id, "upsert", version(b.versioned, 1), doc).Scan(&b.failed); err != nil {
				return err
			}
			d.written++
			books = append(books, b)
			failed = append(failed, b.failed)
		}
	}
	if err := d.poll(ctx, "the refused upserts to fail", func(ctx context.Context) (bool, error) {
		var refused, done int
		err := pool.QueryRow(ctx, `
			SELECT count(*) FILTER (WHERE status = 'failed' AND error_reason = 'mapping_error'),
			       count(*) FILTER (WHERE status = 'done')
			  FROM `+harness.ArchivedEventStates+` WHERE id = ANY($1)`, failed).Scan(&refused, &done)
		if err == nil && done > 0 {
			return false, harness.Fatal(fmt.Errorf("%d upserts with an %s were done: the index's mapping is not strict", done, mappingFixField))
		}
		return err == nil && refused == len(failed), err
	}); err != nil {
		return err
	}
	// Only now: in one batch with a newer event of its book, a refused
	// upsert would be superseded unsent instead of failing.
	var then []int64
	for i, b := range books {
		if b.thenOp == "" {
			continue
		}
		payload := map[string]any{}
		if b.thenOp == "upsert" {
			payload = book(b.id, "v2", "lib-r", 2, "")
		}
		if err := pool.QueryRow(ctx, seedSQL, b.id, b.thenOp, version(b.versioned, 2), payload).Scan(&books[i].then); err != nil {
			return err
		}
		d.written++
		then = append(then, books[i].then)
	}
	if err := d.poll(ctx, "the deletes and newer upserts to be done", func(ctx context.Context) (bool, error) {
		done, err := d.countDone(ctx, then)
		return err == nil && done == len(then), err
	}); err != nil {
		return err
	}
	d.seeded = books
	d.say("replay seed: %d upserts failed on the strict mapping; then %d deletes and newer upserts of their books were applied",
		len(failed), len(then))
	return nil
}

// countDone counts the events of ids that are done, on the view: a queued
// row that succeeds is done by its projection's position, its own status
// unchanged.
func (d *drill) countDone(ctx context.Context, ids []int64) (int, error) {
	var done int
	err := d.s.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM `+harness.ArchivedEventStates+` WHERE id = ANY($1) AND status = 'done'`, ids).Scan(&done)
	return done, err
}

// version is an event_version, or null for an unversioned book.
func version(versioned bool, v int64) *int64 {
	if !versioned {
		return nil
	}
	return &v
}

// replayAfterDelete has the engine forget its deletes, fixes the mapping,
// replays the seeded failures through the binary and kills the leader
// while they are in flight. Every replayed row must end done, and the
// ledger must still name the delete or newer upsert of each book that had
// one: the replayed upsert was dropped, not sent.
func (d *drill) replayAfterDelete(ctx context.Context, sc *Scenario) error {
	if len(d.seeded) == 0 {
		return errors.New("nothing to replay: the seed failed")
	}
	forgot, err := d.forgetDeletes(ctx)
	sc.EngineForgotDeletes = &forgot
	if err != nil {
		return err
	}
	if err := harness.ES(ctx, d.cfg.ElasticURL, http.MethodPut, "/"+d.s.Index+"/_mapping", []byte(mappingFix), nil); err != nil {
		return fmt.Errorf("fix the mapping: %w", err)
	}
	old, epoch, err := d.waitLeader(ctx, 0)
	if err != nil {
		return err
	}
	ids := make([]int64, len(d.seeded))
	behind := 0
	for i, b := range d.seeded {
		ids[i] = b.failed
		if b.then != 0 {
			behind++
		}
	}
	if err := d.replayRows(ctx, ids); err != nil {
		return err
	}
	sc.Replayed, sc.ReplayedBehind = ptr(len(ids)), ptr(behind)

	// At once, so that the replayed rows are in flight, or not yet claimed.
	h, err := d.killLeaderNow(ctx, sc, old, epoch)
	if err != nil {
		return err
	}
	d.say("replay-after-delete: replayed %d rows (%d behind the ledger), killed %s; %s led at epoch %d and acked %.3f s after the kill",
		len(ids), behind, old.name, h.next.name, h.epoch, h.secs)
	if err := d.startProc(ctx, old); err != nil {
		return err
	}
	if err := d.waitStandby(ctx, old); err != nil {
		return err
	}
	if err := d.waitReplayedDone(ctx, ids); err != nil {
		return err
	}
	if err := d.checkSeedDocs(ctx); err != nil {
		return err
	}
	return d.checkSeedLedger(ctx)
}

// waitReplayedDone waits until every replayed row is done; one failing
// again ends the drill.
func (d *drill) waitReplayedDone(ctx context.Context, ids []int64) error {
	return d.poll(ctx, "the replayed rows to be done", func(ctx context.Context) (bool, error) {
		var done, failed int
		err := d.s.DB.Pool.QueryRow(ctx, `
			SELECT count(*) FILTER (WHERE status = 'done'), count(*) FILTER (WHERE status = 'failed')
			  FROM `+harness.ArchivedEventStates+` WHERE id = ANY($1)`, ids).Scan(&done, &failed)
		if err == nil && failed > 0 {
			return false, harness.Fatal(fmt.Errorf("%d replayed rows failed again", failed))
		}
		return err == nil && done == len(ids), err
	})
}

// checkSeedDocs reads the seeded books' documents (get is real-time, no
// refresh needed): a deleted book must be gone, the others at the version
// of their last event.
func (d *drill) checkSeedDocs(ctx context.Context) error {
	ids := make([]string, len(d.seeded))
	for i, b := range d.seeded {
		ids[i] = "book:" + b.id
	}
	body, err := json.Marshal(map[string]any{"ids": ids})
	if err != nil {
		return err
	}
	var got struct {
		Docs []struct {
			ID      string `json:"_id"`
			Found   bool   `json:"found"`
			Version int64  `json:"_version"`
		} `json:"docs"`
	}
	if err := harness.ES(ctx, d.cfg.ElasticURL, http.MethodPost, "/"+d.s.Index+"/_mget?_source=false", body, &got); err != nil {
		return err
	}
	if len(got.Docs) != len(ids) {
		return fmt.Errorf("_mget answered %d documents for %d ids", len(got.Docs), len(ids))
	}
	var wrong []string
	for i, doc := range got.Docs {
		switch b := d.seeded[i]; {
		case b.thenOp == "delete" && doc.Found:
			wrong = append(wrong, fmt.Sprintf("%s: deleted, found at version %d", doc.ID, doc.Version))
		case b.thenOp != "delete" && !doc.Found:
			wrong = append(wrong, doc.ID+": missing")
		case b.thenOp == "upsert" && doc.Version != 2, b.thenOp == "" && doc.Version != 1:
			wrong = append(wrong, fmt.Sprintf("%s: found at version %d", doc.ID, doc.Version))
		}
	}
	if len(wrong) > 0 {
		return fmt.Errorf("%d replayed books are wrong in the engine: %s", len(wrong), strings.Join(wrong[:min(len(wrong), 5)], "; "))
	}
	return nil
}

// checkSeedLedger compares the seeded books' ledger entries with the event
// each must name: the newest entry the ledger held, kept or since dropped
// by its rotation (the -retention is short: once its replayed event is
// done, a live book's entry past the retention may go at the next
// rotation; the final verdict judges whether a drop was legitimate).
func (d *drill) checkSeedLedger(ctx context.Context) error {
	books, want := make([]string, len(d.seeded)), make([]int64, len(d.seeded))
	for i, b := range d.seeded {
		books[i], want[i] = b.id, b.ledgerWant()
	}
	rows, err := d.s.DB.Pool.Query(ctx, `
		SELECT s.entity_id, s.event_id, coalesce(a.event_id, 0)
		  FROM unnest($1::text[], $2::bigint[]) AS s(entity_id, event_id)
		  LEFT JOIN LATERAL (SELECT l.event_id FROM `+harness.ArchivedLedger+` l
		                      WHERE l.projection = 'search' AND l.entity_type = 'book' AND l.entity_id = s.entity_id
		                      ORDER BY l.version DESC, l.event_id DESC LIMIT 1) a ON true
		 WHERE a.event_id IS DISTINCT FROM s.event_id`, books, want)
	if err != nil {
		return err
	}
	defer rows.Close()
	var wrong []string
	for rows.Next() {
		var book string
		var want, got int64
		if err := rows.Scan(&book, &want, &got); err != nil {
			return err
		}
		wrong = append(wrong, fmt.Sprintf("book:%s names event %d, want %d", book, got, want))
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if len(wrong) > 0 {
		return fmt.Errorf("%d ledger entries of replayed books are wrong: %s", len(wrong), strings.Join(wrong[:min(len(wrong), 5)], "; "))
	}
	return nil
}

// replayRows returns failed rows to pending as an operator would: wlproj
// replay, as the runtime role.
func (d *drill) replayRows(ctx context.Context, ids []int64) error {
	dbURL, err := harness.UserURL(d.s.DB.URL, d.s.Runtime, d.runtimePassword)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, d.s.Bin, "replay", "--ids", replay.FormatIDs(ids),
		"--by", "drill", "--why", mappingFixField+" added to the mapping, after the deletes")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("wlproj replay: %w\n%s", err, out)
	}
	var n int
	if err := d.s.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM `+harness.ArchivedEventStates+` WHERE id = ANY($1) AND replay_count = 1`, ids).Scan(&n); err != nil {
		return err
	}
	if n != len(ids) {
		return fmt.Errorf("wlproj replay returned %d of %d rows to pending", n, len(ids))
	}
	return nil
}

// forgetDeletes pauses the producers and drains the outbox, then has the
// engine forget every delete's version (harness.ForgetDeletes), which needs
// nothing in flight.
func (d *drill) forgetDeletes(ctx context.Context) (bool, error) {
	d.prod.pause()
	defer d.prod.resume()
	if err := harness.WaitDrained(ctx, stepTimeout, d.s.DB.Pool); err != nil {
		return false, err
	}
	if err := harness.ForgetDeletes(ctx, d.cfg.ElasticURL, d.s.Index, stepTimeout); err != nil {
		return false, err
	}
	return true, nil
}

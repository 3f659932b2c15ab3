package main

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// words is the vocabulary of the generated books: ordinary prose, so the
// engine's analyzer does the work it does on real text.
var words = strings.Fields(`the library shelf book chapter page reader author story river mountain
	winter summer evening morning garden kitchen letter window history science music travel
	friend family city village ocean forest journey secret promise question answer light
	shadow silence voice memory dream season harvest market bridge station road path stone
	water fire wind cloud rain snow storm quiet bright early late old new small great long
	short open closed first last every many few other same different young ancient modern
	simple careful sudden gentle strange familiar distant near across between under over
	through toward against without within after before during since until while because
	although however therefore meanwhile perhaps almost always never often rarely together`)

// doc is one generated book: the fields of testdata/mapping.json, about
// size bytes of JSON, the same for a given i in every step.
func doc(i, size int) []byte {
	r := rand.New(rand.NewPCG(uint64(i), 0x5eed))
	pick := func(n int) string {
		var sb strings.Builder
		for j := range n {
			if j > 0 {
				sb.WriteByte(' ')
			}
			sb.WriteString(words[r.IntN(len(words))])
		}
		return sb.String()
	}
	d := map[string]any{
		"kind":       "book",
		"title":      pick(4 + r.IntN(4)),
		"library_id": "lib-" + strconv.Itoa(i%97),
		"book_id":    "book-" + strconv.Itoa(i),
		"author":     pick(2),
		"tags":       []string{words[r.IntN(len(words))], words[r.IntN(len(words))]},
		"position":   i,
		"created_at": time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(i) * time.Second).Format(time.RFC3339),
		"updated_at": time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(i) * time.Second).Format(time.RFC3339),
	}
	head, _ := json.Marshal(d)
	var body strings.Builder
	for body.Len() < size-len(head)-20 {
		if body.Len() > 0 {
			body.WriteByte(' ')
		}
		body.WriteString(words[r.IntN(len(words))])
	}
	d["body"] = body.String()
	d["word_count"] = strings.Count(body.String(), " ") + 1
	out, _ := json.Marshal(d)
	return out
}

// entityID is the entity of document i; DocumentID("book", entityID(i)) is its _id.
func entityID(i int) string { return strconv.Itoa(i) }

// loadEvents inserts n upsert events of books from..from+n-1 with version 1
// by COPY, as an application's backlog would look once written. status
// empty leaves the column's default, queued since migration 00018, as an
// application's rows are; statusPending makes rows for the claim path
// (what a retried or replayed row is), which the bare loop and the claim
// cost step time.
func (b *bench) loadEvents(ctx context.Context, from, n int, status string) error {
	const chunk = 10_000
	cols := []string{"entity_type", "entity_id", "op", "event_version", "payload", "scope_key"}
	if status != "" {
		cols = append(cols, "status")
	}
	for start := from; start < from+n; start += chunk {
		end := min(start+chunk, from+n)
		rows := make([][]any, 0, end-start)
		for i := start; i < end; i++ {
			row := []any{"book", entityID(i), "upsert", int64(1), json.RawMessage(doc(i, b.cfg.DocBytes)), "lib-" + strconv.Itoa(i%97)}
			if status != "" {
				row = append(row, status)
			}
			rows = append(rows, row)
		}
		if _, err := b.pool.CopyFrom(ctx, pgx.Identifier{"outbox_events"}, cols, pgx.CopyFromRows(rows)); err != nil {
			return err
		}
	}
	return nil
}

// loadEventsTo is loadEvents of n queued events from 0, the i-th for
// projection projections[i % len(projections)].
func (b *bench) loadEventsTo(ctx context.Context, n int, projections []string) error {
	const chunk = 10_000
	cols := []string{"projection", "entity_type", "entity_id", "op", "event_version", "payload", "scope_key"}
	for start := 0; start < n; start += chunk {
		rows := make([][]any, 0, chunk)
		for i := start; i < min(start+chunk, n); i++ {
			rows = append(rows, []any{projections[i%len(projections)], "book", entityID(i), "upsert", int64(1),
				json.RawMessage(doc(i, b.cfg.DocBytes)), "lib-" + strconv.Itoa(i%97)})
		}
		if _, err := b.pool.CopyFrom(ctx, pgx.Identifier{"outbox_events"}, cols, pgx.CopyFromRows(rows)); err != nil {
			return err
		}
	}
	return nil
}

// statusPending is a row the claim path takes (loadEvents).
const statusPending = "pending"

package main

import (
	"context"
	"fmt"
	"time"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
)

// 6. Median claim time with only the pending rows, then with history,
// then beside a paused projection's backlog and beside rows in backoff.
func (b *bench) claimCost(ctx context.Context) error {
	cc := &ClaimCost{Batch: b.cfg.Batch, Samples: b.cfg.ClaimSamples, DoneRows: b.cfg.DoneRows, FailedRows: b.cfg.FailedRows,
		ParkedRows: b.cfg.ParkedRows}
	var err error
	if cc.EmptyMedianMs, _, err = b.claimMedian(ctx, tableEmpty); err != nil {
		return err
	}
	if cc.ScaleMedianMs, cc.LedgerRows, err = b.claimMedian(ctx, tableHistory); err != nil {
		return err
	}
	if err := b.pool.QueryRow(ctx, `SELECT sum(pg_total_relation_size(relid))::bigint FROM pg_partition_tree('outbox_events')`).Scan(&cc.TableBytes); err != nil {
		return err
	}
	cc.Ratio = harness.Round3(cc.ScaleMedianMs / cc.EmptyMedianMs)
	b.say("claim cost: median %.2f ms empty, %.2f ms with %d done and %d failed rows: ratio %.2f",
		cc.EmptyMedianMs, cc.ScaleMedianMs, cc.DoneRows, cc.FailedRows, cc.Ratio)
	if cc.ParkedRows > 0 {
		if cc.PausedMedianMs, _, err = b.claimMedian(ctx, tablePaused); err != nil {
			return err
		}
		if cc.BackoffMedianMs, _, err = b.claimMedian(ctx, tableBackoff); err != nil {
			return err
		}
		cc.PausedRatio = harness.Round3(cc.PausedMedianMs / cc.EmptyMedianMs)
		cc.BackoffRatio = harness.Round3(cc.BackoffMedianMs / cc.EmptyMedianMs)
		b.say("claim cost: median %.2f ms beside %d paused rows (%.2fx), %.2f ms beside %d rows in backoff (%.2fx)",
			cc.PausedMedianMs, cc.ParkedRows, cc.PausedRatio, cc.BackoffMedianMs, cc.ParkedRows, cc.BackoffRatio)
	}
	b.rep.ClaimCost = cc
	return nil
}

// The table states the claim is timed in.
const (
	tableEmpty   = "empty"
	tableHistory = "history"
	tablePaused  = "paused"
	tableBackoff = "backoff"
)

// claimMedian is the median time of one claim in table state state, and
// the ledger entries of the history.
func (b *bench) claimMedian(ctx context.Context, state string) (median float64, ledger int64, err error) {
	const name = "bench-claim"
	if err := b.reset(ctx); err != nil {
		return 0, 0, err
	}
	if err := b.park(ctx, state); err != nil {
		return 0, 0, err
	}
	if state == tableHistory {
		if ledger, err = b.loadHistory(ctx); err != nil {
			return 0, 0, err
		}
	}
	// The claim path takes pending rows only (retried, replayed, resumed
	// ones since migration 00018): the claimed rows and the parked ones
	// are written pending, the history done as a claimed row's ack left it.
	pending := b.cfg.ClaimSamples * b.cfg.Batch
	if err := b.loadEvents(ctx, 0, pending, statusPending); err != nil {
		return 0, 0, err
	}
	if err := b.vacuum(ctx); err != nil {
		return 0, 0, err
	}
	if _, err := b.pool.Exec(ctx, `INSERT INTO outbox_leader (name, holder, epoch) VALUES ($1, $1, 1)`, name); err != nil {
		return 0, 0, err
	}
	store := &outbox.Store{Pool: b.pool, Owner: name, LeaderName: name}
	var times []float64
	for range b.cfg.ClaimSamples {
		start := time.Now()
		events, err := store.Claim(ctx, 1, b.cfg.Batch, time.Minute, []string{projection.SearchName})
		elapsed := time.Since(start)
		if err != nil {
			return 0, 0, err
		}
		if len(events) != b.cfg.Batch {
			return 0, 0, fmt.Errorf("claimed %d events, want %d", len(events), b.cfg.Batch)
		}
		times = append(times, elapsed.Seconds()*1000)
		ids := make([]int64, len(events))
		for i, e := range events {
			ids[i] = e.ID
		}
		if _, err := store.AckDone(ctx, 1, events[0].Claim, ids, ids); err != nil {
			return 0, 0, err
		}
	}
	return harness.NewStats(times).Median, ledger, nil
}

// park writes, before the claimed rows (lower ids, so an id-ordered walk
// passes them first), the rows the claim must leave alone in state: a
// paused projection's pending rows, or rows waiting out a backoff.
func (b *bench) park(ctx context.Context, state string) error {
	var sql string
	switch state {
	case tablePaused:
		sql = `INSERT INTO outbox_events (projection, entity_type, entity_id, op, event_version, payload, status)
			SELECT 'chronicle', 'book', 'p' || g, 'upsert', 1, '{}', 'pending' FROM generate_series(1, $1) g`
		if _, err := b.pool.Exec(ctx, `INSERT INTO outbox_projection_state (projection, paused, changed_by, why)
			VALUES ('chronicle', true, 'bench', 'claim cost beside a paused projection')`); err != nil {
			return err
		}
	case tableBackoff:
		sql = `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload, attempts, next_retry_at, status)
			SELECT 'book', 'r' || g, 'upsert', 1, '{}', 3, now() + interval '1 hour', 'pending' FROM generate_series(1, $1) g`
	default:
		return nil
	}
	_, err := b.pool.Exec(ctx, sql, b.cfg.ParkedRows)
	return err
}

// loadHistory writes the done and failed rows a long-running outbox keeps,
// with payloads of the same size as the live ones, in chunks so progress
// shows and no single transaction grows huge.
func (b *bench) loadHistory(ctx context.Context) (ledger int64, err error) {
	const chunk = 250_000
	reps := max(1, b.cfg.DocBytes/33)
	for _, part := range []struct {
		status string
		rows   int
	}{{"done", b.cfg.DoneRows}, {"failed", b.cfg.FailedRows}} {
		for from := 0; from < part.rows; from += chunk {
			to := min(from+chunk, part.rows)
			if _, err := b.pool.Exec(ctx, `
				INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload, status, attempts,
				                           processed_at, error_class, error_reason, last_error, created_at, updated_at)
				SELECT 'book', 'h' || g, 'upsert', 1,
				       jsonb_build_object('kind', 'book', 'title', 'Book ' || g, 'body', repeat(md5(g::text) || ' ', $3)),
				       $4, 1,
				       CASE WHEN $4 = 'done' THEN now() END,
				       CASE WHEN $4 = 'failed' THEN 'deterministic' END,
				       CASE WHEN $4 = 'failed' THEN 'mapping_error' END,
				       CASE WHEN $4 = 'failed' THEN 'strict_dynamic_mapping_exception: mapping set to strict' END,
				       now() - interval '1 day', now() - interval '1 day'
				  FROM generate_series($1::int, $2::int - 1) g`, from, to, reps, part.status); err != nil {
				return 0, err
			}
			b.say("claim cost: %d of %d %s rows written", to, part.rows, part.status)
		}
	}
	// The claim reads each document's ledger entry: a real outbox's history
	// comes with one per document applied, as the ledger's backfill writes
	// them (the claimed documents are new: no entry, in both table states).
	tag, err := b.pool.Exec(ctx, `
		INSERT INTO outbox_ledger (projection, entity_type, entity_id, version, deleted, event_id, applied_at)
		SELECT projection, entity_type, entity_id, coalesce(event_version, id), op = 'delete', id, processed_at
		  FROM outbox_events WHERE status = 'done'`)
	return tag.RowsAffected(), err
}

package main

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// holdApplication names the outside transaction's session, so that the
// health samples name it as the horizon's holder.
const holdApplication = "bench-soak-hold"

// soakHold is issue 33's outside transaction: a plain REPEATABLE READ
// transaction that read the outbox once, on a connection of its own, as a
// report or a pg_dump would; its snapshot holds the vacuum horizon of the
// whole database from -soak-hold-from to -soak-hold-to. Nil when off.
type soakHold struct {
	cancel context.CancelFunc
	done   chan struct{}
	res    SoakHold
	err    error
}

// startHold runs the hold in the background, its times from start.
func (b *bench) startHold(ctx context.Context, start time.Time) *soakHold {
	c := b.cfg.Soak
	if c.HoldTo == 0 {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	h := &soakHold{cancel: cancel, done: make(chan struct{}),
		res: SoakHold{FromSeconds: c.HoldFrom.Seconds(), ToSeconds: c.HoldTo.Seconds()}}
	go func() {
		defer close(h.done)
		h.err = b.hold(ctx, start, &h.res)
	}()
	return h
}

// stop ends the hold, wherever it is: the step failed or is over.
func (h *soakHold) stop() {
	if h != nil {
		h.cancel()
		<-h.done
	}
}

// result waits for the hold to end and to see the catch-up after it.
func (h *soakHold) result() (*SoakHold, error) {
	if h == nil {
		return nil, nil
	}
	<-h.done
	return &h.res, h.err
}

// hold opens the transaction at HoldFrom, rolls it back at HoldTo, and
// waits until wlproj caught up with the events committed before then.
func (b *bench) hold(ctx context.Context, start time.Time, res *SoakHold) error {
	c := b.cfg.Soak
	if err := harness.Sleep(ctx, time.Until(start.Add(c.HoldFrom))); err != nil {
		return err
	}
	cfg, err := pgx.ParseConfig(b.s.DB.URL)
	if err != nil {
		return err
	}
	cfg.RuntimeParams["application_name"] = holdApplication
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, `BEGIN ISOLATION LEVEL REPEATABLE READ`); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, `SELECT 1 FROM outbox_events LIMIT 1`); err != nil {
		return err
	}
	b.say("soak: outside transaction open, holding the horizon until %s", c.HoldTo)
	if err := harness.Sleep(ctx, time.Until(start.Add(c.HoldTo))); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, `ROLLBACK`); err != nil {
		return err
	}
	return b.catchUp(ctx, res)
}

// caughtUpSQL says whether every event of a transaction begun before a
// moment ($2: the xmax of a snapshot then) and every claimed row up to an
// id ($1) is done. A queued row is behind its projection's position if it
// is visible in the position's first snapshot: only rows of transactions in
// progress then, or begun after it, need the position's test, and of those
// only the ones begun before the moment; each a walk of the queued index
// that finds nothing once caught up. Transactions of other databases widen
// the snapshots but write no outbox row, so they hold none of this back.
const caughtUpSQL = `
SELECT NOT EXISTS (
         SELECT 1 FROM outbox_queue_heads h
          WHERE EXISTS (SELECT 1 FROM outbox_events q
                         WHERE q.status = 'queued' AND q.projection = h.projection
                           AND q.xid = ANY(ARRAY(SELECT pg_snapshot_xip(h.done_prev))) AND q.xid < $2::xid8
                           AND NOT outbox_behind(q.xid, q.id, h.done_prev, h.done_cur, h.done_xid, h.done_id))
             OR EXISTS (SELECT 1 FROM outbox_events q
                         WHERE q.status = 'queued' AND q.projection = h.projection
                           AND q.xid >= pg_snapshot_xmax(h.done_prev) AND q.xid < $2::xid8
                           AND NOT outbox_behind(q.xid, q.id, h.done_prev, h.done_cur, h.done_xid, h.done_id)))
   AND NOT EXISTS (SELECT 1 FROM outbox_events WHERE (status = 'pending' OR status = 'processing') AND id <= $1),
       clock_timestamp()`

// catchUp measures, from the rollback just done, the backlog then and the
// time until wlproj caught up with it (caughtUpSQL, every half second: a
// count of outbox_queue_backlog each time would walk the whole backlog).
func (b *bench) catchUp(ctx context.Context, res *SoakHold) error {
	var ended time.Time
	var upto int64
	var xmax string
	err := b.pool.QueryRow(ctx, `
		SELECT clock_timestamp(), (SELECT coalesce(max(id), 0) FROM outbox_events),
		       pg_snapshot_xmax(pg_current_snapshot())::text,
		       (SELECT count(*) FROM outbox_queue_backlog)
		     + (SELECT count(*) FROM outbox_events WHERE status = 'pending' OR status = 'processing')`).
		Scan(&ended, &upto, &xmax, &res.BacklogAtEnd)
	if err != nil {
		return err
	}
	b.say("soak: outside transaction rolled back; %d events not done then", res.BacklogAtEnd)
	timeout := b.cfg.Soak.Duration + b.drainTimeout(int(res.BacklogAtEnd))
	var caught time.Time
	err = harness.PollAt(ctx, 500*time.Millisecond, timeout, "wlproj to catch up after the outside transaction",
		func(ctx context.Context) (bool, error) {
			var done bool
			err := b.pool.QueryRow(ctx, caughtUpSQL, upto, xmax).Scan(&done, &caught)
			return err == nil && done, err
		})
	if err != nil {
		return err
	}
	res.CaughtUpSeconds = harness.Round3(caught.Sub(ended).Seconds())
	b.say("soak: caught up %.1fs after the outside transaction ended", res.CaughtUpSeconds)
	return nil
}

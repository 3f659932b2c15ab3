package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/internal/testkit/holdproxy"
	"github.com/wlproj/wlproj/projection"
)

const (
	// lateBook is the deposed-leader-late-write scenario's book, which no
	// producer writes.
	lateBook = "late-write"
	// lateUpsert and lateDelete are its two versions.
	lateUpsert, lateDelete = 5, 6
	// lateArrival is how long the released bytes get to reach the engine
	// before the book is read: on loopback they take milliseconds.
	lateArrival = time.Second
)

// deposedLateWrite holds the leader's path to the engine, lets it send a
// bulk with upsert v5 of a fresh book, kills it -9 and has the new leader
// apply v5 and then delete v6. The engine then forgets the delete, as
// index.gc_deletes would after 60 s, and the held bytes are released: they
// must not bring the book back. The hold proxy delivers them only if the
// dead leader's connection ended without an RST, which SO_LINGER 0 sends.
func (d *drill) deposedLateWrite(ctx context.Context, sc *Scenario) error {
	d.prod.pause()
	defer d.prod.resume()
	// Alone in flight: ForgetDeletes below needs it, and the held bulk then
	// holds the book and nothing else.
	if err := harness.WaitDrained(ctx, stepTimeout, d.s.DB.Pool); err != nil {
		return err
	}
	old, epoch, err := d.waitLeader(ctx, 0)
	if err != nil {
		return err
	}
	old.engine.Hold()
	defer old.engine.Release()
	upsert, err := d.writeLate(ctx, "upsert", lateUpsert, book(lateBook, "v5", "lib-late", lateUpsert, ""))
	if err != nil {
		return err
	}
	held, err := d.waitHeldBulk(ctx, old.engine)
	if err != nil {
		return err
	}
	sc.HeldBytes = ptr(int64(len(held)))
	// At once: the bulk's own deadline (ELASTIC_TIMEOUT_SECONDS) would
	// otherwise cancel it, and reset the connection, before the kill.
	h, err := d.killLeaderNow(ctx, sc, old, epoch)
	if err != nil {
		return err
	}
	if err := d.applyThenDelete(ctx, upsert); err != nil {
		return err
	}
	sc.HeldOutcome = heldOutcome(old.engine.Release())
	d.say("deposed-leader-late-write: %s's bulk held (%d bytes), %s killed; %s applied v%d and deleted it at v%d; the engine forgot the delete; the held bytes were %s",
		old.name, len(held), old.name, h.next.name, lateUpsert, lateDelete, sc.HeldOutcome)
	if err := harness.Sleep(ctx, lateArrival); err != nil {
		return err
	}
	found, version, err := docVersion(ctx, d.cfg.ElasticURL, d.s.Index, projection.DocumentID("book", lateBook))
	if err != nil {
		return err
	}
	sc.Resurrected = ptr(found)
	if found {
		return fmt.Errorf("book:%s resurrected at version %d by the deposed leader's late bulk (held bytes %s)",
			lateBook, version, sc.HeldOutcome)
	}
	if err := d.startProc(ctx, old); err != nil {
		return err
	}
	return d.waitStandby(ctx, old)
}

// applyThenDelete waits for the new leader to apply the upsert, then
// deletes the book at a higher version and has the engine forget the
// delete, as index.gc_deletes would.
func (d *drill) applyThenDelete(ctx context.Context, upsert int64) error {
	if err := d.waitDone(ctx, upsert); err != nil {
		return err
	}
	del, err := d.writeLate(ctx, "delete", lateDelete, map[string]any{})
	if err != nil {
		return err
	}
	if err := d.waitDone(ctx, del); err != nil {
		return err
	}
	return harness.ForgetDeletes(ctx, d.cfg.ElasticURL, d.s.Index, stepTimeout)
}

// heldOutcome says what became of the held connections' bytes.
func heldOutcome(rel holdproxy.Released) string {
	switch {
	case rel.Dropped > 0 && rel.Delivered == 0:
		return "dropped"
	case rel.Delivered > 0 && rel.Dropped == 0:
		return "delivered"
	}
	return fmt.Sprintf("%d connections dropped, %d delivered", rel.Dropped, rel.Delivered)
}

// writeLate writes one event of the scenario's book and returns its id.
func (d *drill) writeLate(ctx context.Context, op string, version int64, payload map[string]any) (int64, error) {
	var id int64
	if err := d.s.DB.Pool.QueryRow(ctx, seedSQL, lateBook, op, version, payload).Scan(&id); err != nil {
		return 0, err
	}
	d.written++
	return id, nil
}

// waitHeldBulk waits until the held bytes hold the book's bulk and returns
// them.
func (d *drill) waitHeldBulk(ctx context.Context, p *holdproxy.Proxy) ([]byte, error) {
	id, _ := json.Marshal(projection.DocumentID("book", lateBook))
	var held []byte
	err := d.poll(ctx, "the leader's bulk to be held", func(context.Context) (bool, error) {
		for _, h := range p.Held() {
			if bytes.Contains(h.Bytes, id) {
				held = h.Bytes
				return true, nil
			}
		}
		return false, nil
	})
	return held, err
}

// waitDone waits until event id is done; failed ends the scenario. The
// view says it: a queued row that succeeds keeps its own status.
func (d *drill) waitDone(ctx context.Context, id int64) error {
	return d.poll(ctx, fmt.Sprintf("event %d to be done", id), func(ctx context.Context) (bool, error) {
		var status string
		err := d.s.DB.Pool.QueryRow(ctx, `SELECT status FROM `+harness.ArchivedEventStates+` WHERE id = $1`, id).Scan(&status)
		if err == nil && status == "failed" {
			return false, harness.Fatal(fmt.Errorf("event %d failed", id))
		}
		return err == nil && status == "done", err
	})
}

// docVersion reads a document in real time (no refresh needed): whether
// the engine has it, and at which version.
func docVersion(ctx context.Context, base, index, id string) (bool, int64, error) {
	var doc struct {
		Found   bool  `json:"found"`
		Version int64 `json:"_version"`
	}
	err := harness.ES(ctx, base, http.MethodGet, "/"+index+"/_doc/"+id+"?_source=false", nil, &doc)
	if se := (*harness.StatusError)(nil); errors.As(err, &se) && se.Code == http.StatusNotFound {
		return false, 0, nil
	}
	return doc.Found, doc.Version, err
}

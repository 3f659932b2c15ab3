package harness

import (
	"testing"

	"github.com/wlproj/wlproj/outbox"
)

// Outbox is a migrated database of the test's own and an outbox.Store on
// it that claims as worker "w1" under the leader name "test"; no one leads
// until Lead says so.
type Outbox struct {
	DB
	Store *outbox.Store
}

// NewOutbox makes an Outbox, dropped when the test ends.
func NewOutbox(t testing.TB) Outbox {
	t.Helper()
	db := NewDatabase(t)
	return Outbox{DB: db, Store: &outbox.Store{Pool: db.Pool, Owner: "w1", LeaderName: "test"}}
}

// Lead makes w1 the leader of epoch, as an election would leave the
// leader row; a later call moves the epoch, as a new leader would.
func (o Outbox) Lead(t testing.TB, epoch int64) {
	t.Helper()
	o.Exec(t, `
		INSERT INTO outbox_leader (name, holder, epoch) VALUES ('test', 'w1', $1)
		ON CONFLICT (name) DO UPDATE SET epoch = excluded.epoch`, epoch)
}

// ClaimedByDefault makes rows inserted without a status pending, as they
// were before migration 00018: for tests of the claim, which takes rows
// that retry, were replayed or predate queued rows.
func (o Outbox) ClaimedByDefault(t testing.TB) Outbox {
	t.Helper()
	o.Exec(t, `ALTER TABLE outbox_events ALTER COLUMN status SET DEFAULT 'pending'`)
	return o
}

package harness

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// verifyCase is a database and an index filled by hand, to see Verify's
// verdict on a state no daemon was asked to produce.
type verifyCase struct {
	db    DB
	index string
}

func newVerifyCase(t *testing.T) verifyCase {
	t.Helper()
	return verifyCase{db: NewDatabase(t), index: NewIndex(t)}
}

// event inserts a search event for book id in the given status; a failed
// one gets reason. Version 0 writes a null event_version: the outbox id is
// the version then.
func (c verifyCase) event(t *testing.T, id string, op string, version int64, status, reason string) {
	t.Helper()
	c.db.Exec(t, `
		INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload, status, error_reason)
		VALUES ('book', $1, $2, nullif($3, 0), '{"kind": "book"}', $4, nullif($5, ''))`, id, op, version, status, reason)
}

// ledger writes book id's ledger entry, naming its newest event.
func (c verifyCase) ledger(t *testing.T, id string, version int64, deleted bool) {
	t.Helper()
	c.db.Exec(t, `
		INSERT INTO outbox_applied (projection, entity_type, entity_id, version, deleted, event_id)
		SELECT 'search', 'book', $1, $2, $3, coalesce(max(id), 0) FROM outbox_events WHERE entity_id = $1`, id, version, deleted)
}

// lastID is the outbox id of the newest row.
func (c verifyCase) lastID(t *testing.T) int64 {
	t.Helper()
	return int64(c.db.Int(t, `SELECT max(id) FROM outbox_events`))
}

// doc indexes book id at an external version, as the daemon would.
func (c verifyCase) doc(t *testing.T, id string, version int64) {
	t.Helper()
	path := fmt.Sprintf("/%s/_doc/book:%s?version=%d&version_type=external_gte", c.index, id, version)
	require.NoError(t, ES(context.Background(), ElasticURL(t), http.MethodPut, path, []byte(`{"kind": "book"}`), nil))
}

func (c verifyCase) verdict(t *testing.T) Verdict {
	t.Helper()
	v, err := Verify(context.Background(), c.db.Pool, ElasticURL(t), c.index)
	require.NoError(t, err)
	return v
}

func TestVerifyAllGood(t *testing.T) {
	t.Parallel()
	c := newVerifyCase(t)
	c.event(t, "1", "upsert", 1, "done", "")
	c.event(t, "1", "upsert", 2, "done", "")
	c.doc(t, "1", 2)
	c.ledger(t, "1", 2, false)
	c.event(t, "2", "upsert", 1, "done", "")
	c.event(t, "2", "delete", 2, "done", "")
	c.ledger(t, "2", 2, true)
	c.event(t, "3", "upsert", 1, "failed", "mapping_error")
	// Out of order: version 3 came first; the later row at 2 was superseded.
	c.event(t, "4", "upsert", 3, "done", "")
	c.event(t, "4", "upsert", 2, "done", "")
	c.doc(t, "4", 3)
	c.ledger(t, "4", 3, false)
	// One version twice: the later outbox row, a delete, wins.
	c.event(t, "5", "upsert", 4, "done", "")
	c.event(t, "5", "delete", 4, "done", "")
	c.ledger(t, "5", 4, true)
	// No event_version: the outbox id is the version.
	c.event(t, "6", "upsert", 0, "done", "")
	c.event(t, "6", "upsert", 0, "done", "")
	c.doc(t, "6", c.lastID(t))
	c.ledger(t, "6", c.lastID(t), false)

	v := c.verdict(t)
	require.True(t, v.OK(), v.String())
	require.Equal(t, Verdict{Events: 11, Done: 10, Failed: 1, Entities: 5}, v, "book 3 has a failed event: left out")
}

func TestVerifyFindsEachWrong(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, c verifyCase)
		want  Verdict
	}{
		{"lost pending", func(t *testing.T, c verifyCase) { c.event(t, "1", "upsert", 1, "pending", "") },
			Verdict{Events: 1, Lost: 1}},
		{"lost processing", func(t *testing.T, c verifyCase) { c.event(t, "1", "upsert", 1, "processing", "") },
			Verdict{Events: 1, Lost: 1}},
		{"failed without reason", func(t *testing.T, c verifyCase) { c.event(t, "1", "upsert", 1, "failed", "") },
			Verdict{Events: 1, Failed: 1, FailedWithoutReason: 1}},
		{"regressed", func(t *testing.T, c verifyCase) {
			c.event(t, "1", "upsert", 1, "done", "")
			c.event(t, "1", "upsert", 3, "done", "")
			c.doc(t, "1", 1)
			c.ledger(t, "1", 3, false)
		}, Verdict{Events: 2, Done: 2, Entities: 1, Regressed: []string{"book:1: want version 3, found 1"}}},
		{"resurrected", func(t *testing.T, c verifyCase) {
			c.event(t, "1", "upsert", 1, "done", "")
			c.event(t, "1", "delete", 2, "done", "")
			c.doc(t, "1", 1)
			c.ledger(t, "1", 2, true)
		}, Verdict{Events: 2, Done: 2, Entities: 1, Resurrected: []string{"book:1: deleted at 2, found at 1"}}},
		{"missing", func(t *testing.T, c verifyCase) {
			c.event(t, "1", "upsert", 4, "done", "")
			c.ledger(t, "1", 4, false)
		}, Verdict{Events: 1, Done: 1, Entities: 1, Missing: []string{"book:1: want version 4"}}},
		{"ledger missing", func(t *testing.T, c verifyCase) {
			c.event(t, "1", "upsert", 1, "done", "")
			c.doc(t, "1", 1)
		}, Verdict{Events: 1, Done: 1, Entities: 1, LedgerMismatch: []string{"book:1: want ledger at 1 upsert, found no entry"}}},
		{"ledger missing a delete", func(t *testing.T, c verifyCase) {
			c.event(t, "1", "delete", 1, "done", "")
		}, Verdict{Events: 1, Done: 1, Entities: 1, LedgerMismatch: []string{"book:1: want ledger at 1 delete, found no entry"}}},
		{"ledger behind", func(t *testing.T, c verifyCase) {
			c.event(t, "1", "upsert", 1, "done", "")
			c.event(t, "1", "upsert", 2, "done", "")
			c.doc(t, "1", 2)
			c.ledger(t, "1", 1, false)
		}, Verdict{Events: 2, Done: 2, Entities: 1, LedgerMismatch: []string{"book:1: want ledger at 2 upsert, found 1 upsert"}}},
		{"ledger behind an out-of-order row", func(t *testing.T, c verifyCase) {
			c.event(t, "1", "upsert", 3, "done", "")
			c.event(t, "1", "upsert", 2, "done", "")
			c.doc(t, "1", 3)
			c.ledger(t, "1", 2, false)
		}, Verdict{Events: 2, Done: 2, Entities: 1, LedgerMismatch: []string{"book:1: want ledger at 3 upsert, found 2 upsert"}}},
		{"ledger ahead", func(t *testing.T, c verifyCase) {
			c.event(t, "1", "upsert", 1, "done", "")
			c.doc(t, "1", 1)
			c.ledger(t, "1", 5, false)
		}, Verdict{Events: 1, Done: 1, Entities: 1, LedgerMismatch: []string{"book:1: want ledger at 1 upsert, found 5 upsert"}}},
		{"ledger says deleted", func(t *testing.T, c verifyCase) {
			c.event(t, "1", "upsert", 1, "done", "")
			c.doc(t, "1", 1)
			c.ledger(t, "1", 1, true)
		}, Verdict{Events: 1, Done: 1, Entities: 1, LedgerMismatch: []string{"book:1: want ledger at 1 upsert, found 1 delete"}}},
		{"ledger misses the later row of a version", func(t *testing.T, c verifyCase) {
			c.event(t, "1", "upsert", 2, "done", "")
			c.event(t, "1", "delete", 2, "done", "")
			c.ledger(t, "1", 2, false)
		}, Verdict{Events: 2, Done: 2, Entities: 1, LedgerMismatch: []string{"book:1: want ledger at 2 delete, found 2 upsert"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := newVerifyCase(t)
			tc.setup(t, c)
			v := c.verdict(t)
			require.False(t, v.OK(), v.String())
			require.Equal(t, tc.want, v)
		})
	}
}

func TestVerifyWithoutIndexSeesEveryUpsertMissing(t *testing.T) {
	t.Parallel()
	db := NewDatabase(t)
	c := verifyCase{db: db, index: NewIndexName(t)}
	c.event(t, "1", "upsert", 1, "done", "")
	c.event(t, "2", "delete", 1, "done", "")
	v := c.verdict(t)
	require.Equal(t, []string{"book:1: want version 1"}, v.Missing)
	require.Empty(t, v.Resurrected)
}

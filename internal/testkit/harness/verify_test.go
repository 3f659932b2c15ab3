package harness

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
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
		INSERT INTO outbox_ledger (projection, entity_type, entity_id, version, deleted, event_id)
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

func (c verifyCase) verdict(t *testing.T, expected ...Failure) Verdict {
	t.Helper()
	v, err := Verify(context.Background(), c.db.Pool, ElasticURL(t), c.index, expected...)
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
	refused3 := c.lastID(t)
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
	// The newest event failed as expected: the delete before it holds.
	c.event(t, "7", "upsert", 1, "done", "")
	c.event(t, "7", "delete", 2, "done", "")
	c.event(t, "7", "upsert", 3, "failed", "mapping_error")
	refused7 := c.lastID(t)
	c.ledger(t, "7", 2, true)
	// Discarded by an operator: neither lost nor applied.
	c.event(t, "8", "upsert", 1, "discarded", "mapping_error")

	v := c.verdict(t, Failure{ID: refused3, Reason: "mapping_error"}, Failure{ID: refused7, Reason: "mapping_error"})
	require.True(t, v.OK(), v.String())
	require.Equal(t, Verdict{Events: 15, Done: 12, Failed: 2, Discarded: 1, Entities: 8}, v)
}

func TestVerifyFindsEachWrong(t *testing.T) {
	t.Parallel()
	// Each case is book 1's events ("op version status", a failed one with
	// its reason after it), in outbox order, the version it is indexed at
	// (0: not indexed) and its ledger entry ("version op"; "": none), written
	// in that order. Outbox ids start at 1 in each case's database; the
	// failures in expect are accepted.
	for _, tc := range []struct {
		name   string
		events []string
		doc    int64
		ledger string
		expect []Failure
		want   Verdict
	}{
		{"lost pending", []string{"upsert 1 pending"}, 0, "", nil,
			Verdict{Events: 1, Lost: 1, Entities: 1}},
		{"lost processing", []string{"upsert 1 processing"}, 0, "", nil,
			Verdict{Events: 1, Lost: 1, Entities: 1}},
		{"failed without reason", []string{"upsert 1 failed"}, 0, "", nil,
			Verdict{Events: 1, Failed: 1, FailedWithoutReason: 1, Entities: 1, Unexpected: []string{`event 1 failed as ""`}}},
		{"failed unexpected", []string{"upsert 1 failed mapping_error"}, 0, "", nil,
			Verdict{Events: 1, Failed: 1, Entities: 1, Unexpected: []string{`event 1 failed as "mapping_error"`}}},
		{"failed for another reason", []string{"upsert 1 failed payload_invalid"}, 0, "", []Failure{{1, "mapping_error"}},
			Verdict{Events: 1, Failed: 1, Entities: 1, Unexpected: []string{`event 1 failed as "payload_invalid"`}}},
		// The first bug: a delete done (superseded in its batch),
		// the newer upsert refused, the book still at its first version.
		{"resurrected behind a failed event", []string{"upsert 1 done", "delete 2 done", "upsert 3 failed mapping_error"}, 1, "1 upsert",
			[]Failure{{3, "mapping_error"}},
			Verdict{Events: 3, Done: 2, Failed: 1, Entities: 1, Resurrected: []string{"book:1: deleted at 2, found at 1"},
				LedgerMismatch: []string{"book:1: want ledger at 2 delete, found 1 upsert"}}},
		{"regressed behind a failed event", []string{"upsert 1 done", "upsert 2 done", "upsert 3 failed mapping_error"}, 1, "2 upsert",
			[]Failure{{3, "mapping_error"}},
			Verdict{Events: 3, Done: 2, Failed: 1, Entities: 1, Regressed: []string{"book:1: want version 2, found 1"}}},
		{"missing behind a failed event", []string{"upsert 1 done", "upsert 2 failed mapping_error"}, 0, "",
			[]Failure{{2, "mapping_error"}},
			Verdict{Events: 2, Done: 1, Failed: 1, Entities: 1, Missing: []string{"book:1: want version 1"},
				LedgerMismatch: []string{"book:1: want ledger at 1 upsert, found no entry"}}},
		{"present with no event done", []string{"upsert 1 failed mapping_error"}, 1, "1 upsert",
			[]Failure{{1, "mapping_error"}},
			Verdict{Events: 1, Failed: 1, Entities: 1, Resurrected: []string{"book:1: no event done, found at 1"},
				LedgerMismatch: []string{"book:1: want no ledger entry, found 1 upsert"}}},
		{"regressed", []string{"upsert 1 done", "upsert 3 done"}, 1, "3 upsert", nil,
			Verdict{Events: 2, Done: 2, Entities: 1, Regressed: []string{"book:1: want version 3, found 1"}}},
		{"resurrected", []string{"upsert 1 done", "delete 2 done"}, 1, "2 delete", nil,
			Verdict{Events: 2, Done: 2, Entities: 1, Resurrected: []string{"book:1: deleted at 2, found at 1"}}},
		{"missing", []string{"upsert 4 done"}, 0, "4 upsert", nil,
			Verdict{Events: 1, Done: 1, Entities: 1, Missing: []string{"book:1: want version 4"}}},
		{"ledger missing", []string{"upsert 1 done"}, 1, "", nil,
			Verdict{Events: 1, Done: 1, Entities: 1, LedgerMismatch: []string{"book:1: want ledger at 1 upsert, found no entry"}}},
		{"ledger missing a delete", []string{"delete 1 done"}, 0, "", nil,
			Verdict{Events: 1, Done: 1, Entities: 1, LedgerMismatch: []string{"book:1: want ledger at 1 delete, found no entry"}}},
		{"ledger behind", []string{"upsert 1 done", "upsert 2 done"}, 2, "1 upsert", nil,
			Verdict{Events: 2, Done: 2, Entities: 1, LedgerMismatch: []string{"book:1: want ledger at 2 upsert, found 1 upsert"}}},
		{"ledger behind an out-of-order row", []string{"upsert 3 done", "upsert 2 done"}, 3, "2 upsert", nil,
			Verdict{Events: 2, Done: 2, Entities: 1, LedgerMismatch: []string{"book:1: want ledger at 3 upsert, found 2 upsert"}}},
		{"ledger ahead", []string{"upsert 1 done"}, 1, "5 upsert", nil,
			Verdict{Events: 1, Done: 1, Entities: 1, LedgerMismatch: []string{"book:1: want ledger at 1 upsert, found 5 upsert"}}},
		{"ledger says deleted", []string{"upsert 1 done"}, 1, "1 delete", nil,
			Verdict{Events: 1, Done: 1, Entities: 1, LedgerMismatch: []string{"book:1: want ledger at 1 upsert, found 1 delete"}}},
		{"ledger misses the later row of a version", []string{"upsert 2 done", "delete 2 done"}, 0, "2 upsert", nil,
			Verdict{Events: 2, Done: 2, Entities: 1, LedgerMismatch: []string{"book:1: want ledger at 2 delete, found 2 upsert"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := newVerifyCase(t)
			for _, e := range tc.events {
				var op, status, reason string
				var version int64
				_, err := fmt.Sscan(e, &op, &version, &status, &reason)
				if err == io.EOF {
					err = nil // no reason
				}
				require.NoError(t, err, e)
				c.event(t, "1", op, version, status, reason)
			}
			if tc.doc != 0 {
				c.doc(t, "1", tc.doc)
			}
			if tc.ledger != "" {
				var version int64
				var op string
				_, err := fmt.Sscan(tc.ledger, &version, &op)
				require.NoError(t, err, tc.ledger)
				c.ledger(t, "1", version, op == "delete")
			}
			v := c.verdict(t, tc.expect...)
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

// rotatedCase is a verifyCase with the rotation archive installed, and the
// retentions its verdict judges the ledger's drops by.
func newRotatedCase(t *testing.T) verifyCase {
	t.Helper()
	c := newVerifyCase(t)
	require.NoError(t, InstallRotationArchive(context.Background(), c.db.Pool))
	return c
}

// testRotation is the retentions of the rotated cases: an entry applied an
// hour before its drop is past the retention, not the tombstone retention.
var testRotation = Rotation{Retention: time.Minute, TombstoneRetention: 2 * time.Hour}

// rotateEvents empties the outbox's current partition (1, the first) as
// the rotation would, new rows going to 2, on pool's role.
func rotateEvents(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	for _, s := range []string{`UPDATE outbox_events_rotation SET slot = 2`, `TRUNCATE outbox_events_1`} {
		_, err := pool.Exec(context.Background(), s)
		require.NoError(t, err, s)
	}
}

// rotateLedger empties the ledger's current partition (0, the first),
// new entries going to 1, on pool's role.
func rotateLedger(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	for _, s := range []string{`UPDATE outbox_ledger_rotation SET slot = 1`, `TRUNCATE outbox_ledger_0`} {
		_, err := pool.Exec(context.Background(), s)
		require.NoError(t, err, s)
	}
}

// ageLedger backdates every ledger entry by age, as if applied that long
// before the rotation.
func (c verifyCase) ageLedger(t *testing.T, age time.Duration) {
	t.Helper()
	c.db.Exec(t, `UPDATE outbox_ledger SET applied_at = applied_at - make_interval(secs => $1)`, age.Seconds())
}

func (c verifyCase) rotatedVerdict(t *testing.T, expected ...Failure) Verdict {
	t.Helper()
	v, err := VerifyRotated(context.Background(), c.db.Pool, ElasticURL(t), c.index, testRotation, expected...)
	require.NoError(t, err)
	return v
}

// Rows the rotation emptied, by the runtime role of roles.sql as the
// replicas rotate, are delivered events in the rotated verdict, and a
// ledger entry it dropped past the retention is no mismatch; the plain
// verdict sees neither (the drill would call the rows vanished). A row
// still pending when its partition was emptied is lost, and a row gone
// without the rotation (a DELETE) is not counted, so the caller's written
// total shows it missing.
func TestVerifyRotatedJudgesArchivedRows(t *testing.T) {
	t.Parallel()
	owner, runtime := Roles(t, "archive")
	c := newVerifyCase(t)
	out, err := ApplyRoles(t, c.db.URL, c.db.Name, owner, runtime)
	require.NoError(t, err, out)
	require.NoError(t, InstallRotationArchive(context.Background(), c.db.Pool))
	asRuntime, err := pgxpool.New(context.Background(), c.db.Login(t, runtime, RuntimePassword))
	require.NoError(t, err)
	t.Cleanup(asRuntime.Close)

	c.event(t, "1", "upsert", 1, "done", "")
	c.event(t, "1", "upsert", 2, "done", "")
	c.doc(t, "1", 2)
	c.ledger(t, "1", 2, false)
	c.ageLedger(t, time.Hour)
	rotateEvents(t, asRuntime)
	rotateLedger(t, asRuntime)
	c.event(t, "4", "upsert", 1, "done", "")
	c.doc(t, "4", 1)
	c.ledger(t, "4", 1, false)

	v := c.rotatedVerdict(t)
	require.True(t, v.OK(), "%s %v", v, v.LedgerMismatch)
	require.Equal(t, Verdict{Events: 3, Done: 3, Entities: 2}, v)
	plain := c.verdict(t)
	require.Equal(t, Verdict{Events: 1, Done: 1, Entities: 1}, plain, "the plain verdict does not see the archived rows")

	// Book 2's event was still pending when its partition was emptied.
	c.event(t, "2", "upsert", 1, "pending", "")
	// Book 3's row is deleted, not rotated: no archive has it.
	c.event(t, "3", "upsert", 1, "done", "")
	c.db.Exec(t, `DELETE FROM outbox_events WHERE entity_id = '3'`)
	rotateEvents2(t, asRuntime)
	v = c.rotatedVerdict(t)
	require.False(t, v.OK())
	require.Equal(t, Verdict{Events: 4, Done: 3, Lost: 1, Entities: 3}, v)
}

// rotateEvents2 empties the outbox's partition 2, new rows going to 0.
func rotateEvents2(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	for _, s := range []string{`UPDATE outbox_events_rotation SET slot = 0`, `TRUNCATE outbox_events_2`} {
		_, err := pool.Exec(context.Background(), s)
		require.NoError(t, err, s)
	}
}

// The rotated verdict takes a dropped ledger entry for the document's
// entry only where the rotation may drop it: past its retention (the
// tombstone retention for a delete), with no event of the document left to
// send, and equal to the newest done event.
func TestVerifyRotatedJudgesDroppedLedgerEntries(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		setup   func(t *testing.T, c verifyCase)
		expect  []Failure
		problem []string // pieces of the one mismatch; none: OK
	}{
		{"dropped past the retention", func(t *testing.T, c verifyCase) {
			c.event(t, "1", "upsert", 1, "done", "")
			c.doc(t, "1", 1)
			c.ledger(t, "1", 1, false)
			c.ageLedger(t, time.Hour)
		}, nil, nil},
		{"dropped within the retention", func(t *testing.T, c verifyCase) {
			c.event(t, "1", "upsert", 1, "done", "")
			c.doc(t, "1", 1)
			c.ledger(t, "1", 1, false)
		}, nil, []string{"book:1: want ledger at 1 upsert, found no entry: the rotation dropped 1 upsert ", "after it was applied, within its retention of 1m0s"}},
		{"a tombstone dropped within the tombstone retention", func(t *testing.T, c verifyCase) {
			c.event(t, "1", "delete", 1, "done", "")
			c.ledger(t, "1", 1, true)
			c.ageLedger(t, time.Hour)
		}, nil, []string{"book:1: want ledger at 1 delete, found no entry: the rotation dropped 1 delete 1h0m", "after it was applied, within its retention of 2h0m0s"}},
		{"dropped while an event could still be sent", func(t *testing.T, c verifyCase) {
			c.event(t, "1", "upsert", 1, "done", "")
			c.doc(t, "1", 1)
			c.ledger(t, "1", 1, false)
			c.ageLedger(t, time.Hour)
			c.event(t, "1", "upsert", 2, "failed", "mapping_error")
		}, []Failure{{2, "mapping_error"}}, []string{"book:1: want ledger at 1 upsert, found no entry: the rotation dropped 1 upsert while an event"}},
		{"dropped behind the newest done event", func(t *testing.T, c verifyCase) {
			c.event(t, "1", "upsert", 1, "done", "")
			c.ledger(t, "1", 1, false)
			c.event(t, "1", "upsert", 2, "done", "")
			c.doc(t, "1", 2)
			c.ageLedger(t, time.Hour)
		}, nil, []string{"book:1: want ledger at 2 upsert, found 1 upsert (dropped by the rotation)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := newRotatedCase(t)
			tc.setup(t, c)
			rotateLedger(t, c.db.Pool)
			v := c.rotatedVerdict(t, tc.expect...)
			if tc.problem == nil {
				require.True(t, v.OK(), "%s %v", v, v.LedgerMismatch)
				return
			}
			require.False(t, v.OK(), v.String())
			require.Len(t, v.LedgerMismatch, 1)
			for _, piece := range tc.problem {
				require.Contains(t, v.LedgerMismatch[0], piece)
			}
		})
	}
}

package cli

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/replay"
)

// docSetup gives book:b1 of opsSetup a long history: 60 done events at
// versions 100..159, besides its failed event (version = its id, low), and
// archives book:b2's failed event.
func docSetup(t *testing.T) opsBundle {
	t.Helper()
	b := opsSetup(t)
	b.db.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, status, processed_at)
		SELECT 'book', 'b1', 'upsert', 99 + g, 'done', now() FROM generate_series(1, 60) g`)
	_, err := replay.Archive(b.ctx, b.db.Pool, replay.ArchiveRequest{OlderThan: time.Minute, IDs: b.ids[1:2], By: "alice", Why: "closed"})
	require.NoError(t, err)
	return b
}

func (b opsBundle) doc(t *testing.T, args ...string) outbox.Document {
	t.Helper()
	code, out, errOut := b.run(t, append([]string{"doc", "--json"}, args...)...)
	require.Zero(t, code, errOut)
	var d outbox.Document
	require.NoError(t, json.Unmarshal([]byte(out), &d), out)
	return d
}

// An archived event can still be restored, so doc lists it.
func TestCmdDocShowsArchivedEvents(t *testing.T) {
	t.Parallel()
	b := docSetup(t)
	d := b.doc(t, "book:b2")
	require.Len(t, d.Events, 1)
	require.Equal(t, b.ids[1], d.Events[0].ID)
	require.Equal(t, "failed", d.Events[0].Status)
	require.NotNil(t, d.Events[0].ArchivedAt)

	code, out, _ := b.run(t, "doc", "book:b2")
	require.Zero(t, code)
	require.Regexp(t, fmt.Sprintf(`(?m)^%d\s+upsert\s+\d+\s+failed, archived \S+\s+timeout`, b.ids[1]), out)
}

// --all lists what the default view lists and more: the cut at 50 leaves
// out the oldest done events only, and says how many.
func TestCmdDocAllKeepsWhatCanStillChangeTheDocument(t *testing.T) {
	t.Parallel()
	b := docSetup(t)
	d := b.doc(t, "book:b1")
	require.Len(t, d.Events, 1, "the failed event alone")
	require.Equal(t, b.ids[0], d.Events[0].ID)

	d = b.doc(t, "book:b1", "--all")
	require.Len(t, d.Events, 50)
	require.EqualValues(t, 11, d.Omitted, "61 events, 50 listed")
	require.Equal(t, b.ids[0], d.Events[len(d.Events)-1].ID, "the failed event is listed, last by version")
	require.EqualValues(t, 159, d.Events[0].Version, "newest first")

	code, out, _ := b.run(t, "doc", "book:b1", "--all")
	require.Zero(t, code)
	require.True(t, strings.HasSuffix(out, "11 older done or discarded events not listed\n"), out)
}

func TestCmdDocRefusesWhatIsNoDocumentID(t *testing.T) {
	t.Parallel()
	b := opsSetup(t)
	for _, arg := range []string{"book", "book:", ":42", "50%off:1"} {
		code, _, errOut := b.run(t, "doc", arg)
		require.Equal(t, 2, code, arg)
		require.Contains(t, errOut, "want the document's _id", arg)
	}
}

// A projection the configuration does not name (misspelt, or removed from
// the projections file) is read all the same, with a warning naming the
// configured ones; a configured one gets none.
func TestCmdDocWarnsOfAProjectionNotConfigured(t *testing.T) {
	t.Parallel()
	b := opsSetup(t)
	code, out, errOut := b.run(t, "doc", "book:b1", "--projection", "serch")
	require.Zero(t, code, errOut)
	require.Contains(t, out, "ledger: serch book:b1 was never applied")
	require.Contains(t, errOut, "not a configured projection")
	require.Contains(t, errOut, `"configured":["chronicle","search"]`)

	code, _, errOut = b.run(t, "doc", "book:b1")
	require.Zero(t, code)
	require.NotContains(t, errOut, "not a configured projection")
}

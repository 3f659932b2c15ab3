package outbox_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
)

// A replica agrees with its leader until both hashes are known and differ:
// no leader yet, a leader of a binary that records none (a record of an
// older epoch is the leader before it), or a schema without the table, is
// no difference; the record is read for the name asked, not another
// name's, and a deposed leader's late record changes nothing.
func TestCompareProjections(t *testing.T) {
	t.Parallel()
	db := harness.NewDatabase(t)
	ctx := context.Background()
	compare := func(name string) outbox.ProjectionsAgreement {
		t.Helper()
		a, err := outbox.CompareProjections(ctx, db.Pool, name, "aaaa")
		require.NoError(t, err)
		return a
	}

	a := compare("wlproj")
	require.Equal(t, outbox.ProjectionsAgreement{Hash: "aaaa"}, a, "nobody has led")
	require.True(t, a.Agree())

	db.Exec(t, `INSERT INTO outbox_leader (name, holder, epoch) VALUES ('wlproj', 'r1', 1), ('other', 'r9', 1)`)
	require.True(t, compare("wlproj").Agree(), "a leader before schema 22 recorded none")

	record := func(name string, epoch int, hash string) {
		t.Helper()
		db.Exec(t, outbox.RecordProjectionsSQL, name, epoch, hash)
	}
	record("other", 1, "bbbb")
	require.True(t, compare("wlproj").Agree(), "another name's leader is not ours")

	record("wlproj", 1, "aaaa")
	require.Equal(t, outbox.ProjectionsAgreement{Hash: "aaaa", Leader: "aaaa"}, compare("wlproj"))
	require.True(t, compare("wlproj").Agree())

	db.Exec(t, `UPDATE outbox_leader SET epoch = 2 WHERE name = 'wlproj'`)
	record("wlproj", 2, "bbbb")
	a = compare("wlproj")
	require.Equal(t, "bbbb", a.Leader)
	require.False(t, a.Agree())
	record("wlproj", 1, "aaaa")
	require.Equal(t, "bbbb", compare("wlproj").Leader, "the deposed leader's late record changes nothing")

	db.Exec(t, `UPDATE outbox_leader SET epoch = 3 WHERE name = 'wlproj'`)
	require.True(t, compare("wlproj").Agree(), "a leader of a binary before 22 recorded none at its epoch")

	// Schema 21, which this binary runs on, has no table to read.
	db.Exec(t, `DROP TABLE outbox_leader_projections`)
	require.Equal(t, outbox.ProjectionsAgreement{Hash: "aaaa"}, compare("wlproj"), "nothing recorded on schema 21")
}

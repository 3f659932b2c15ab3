package outbox_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
)

// A replica agrees with its leader until both hashes are known and differ:
// no leader yet, a leader of a binary that records none, or a schema
// without the column, is no difference; the record is read for the name
// asked, not another name's.
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

	db.Exec(t, `UPDATE outbox_leader SET projections = 'bbbb' WHERE name = 'other'`)
	require.True(t, compare("wlproj").Agree(), "another name's leader is not ours")

	db.Exec(t, `UPDATE outbox_leader SET projections = 'aaaa' WHERE name = 'wlproj'`)
	require.Equal(t, outbox.ProjectionsAgreement{Hash: "aaaa", Leader: "aaaa"}, compare("wlproj"))
	require.True(t, compare("wlproj").Agree())

	db.Exec(t, `UPDATE outbox_leader SET projections = 'bbbb' WHERE name = 'wlproj'`)
	a = compare("wlproj")
	require.Equal(t, "bbbb", a.Leader)
	require.False(t, a.Agree())

	// Schema 21, which this binary runs on, has no column to read.
	db.Exec(t, `ALTER TABLE outbox_leader DROP COLUMN projections`)
	require.Equal(t, outbox.ProjectionsAgreement{Hash: "aaaa"}, compare("wlproj"), "nothing recorded on schema 21")
}

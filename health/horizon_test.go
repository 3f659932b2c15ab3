package health

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// holderLines are the scrape's holder series.
func holderLines(scrape string) []string {
	var out []string
	for line := range strings.SplitSeq(scrape, "\n") {
		if strings.HasPrefix(line, "outbox_db_horizon_holder_pid{") {
			out = append(out, line)
		}
	}
	return out
}

// waitScrape scrapes f until a line of the scrape is line, and returns
// that scrape.
func waitScrape(t *testing.T, f *fixture, what, line string) string {
	t.Helper()
	var scrape string
	harness.Eventually(t, 10*time.Second, what, func() bool {
		scrape = f.get(f.port, "/metrics").raw
		return strings.Contains(scrape, line+"\n")
	})
	return scrape
}

// sample is the value of name in scrape, which must have it.
func sample(t *testing.T, scrape, name string) float64 {
	t.Helper()
	v, ok, err := harness.ParseMetric(scrape, name)
	require.NoError(t, err)
	require.True(t, ok, "%s in the scrape", name)
	return v
}

// The gauges name the session that holds the database's horizon, in one
// series whose value is its pid, with the age of its snapshot and the dead
// rows of the outbox and the ledger; once it ends, the one series says none.
func TestMetricsShowWhoHoldsTheHorizon(t *testing.T) {
	db := harness.NewDatabase(t)
	f := start(t, db.Pool, db.URL, func(c *Config) {
		c.GaugeInterval, c.StandbyGaugeInterval = 100*time.Millisecond, 100*time.Millisecond
	})
	holder := harness.HoldSnapshot(t, db.URL, "app-report")
	db.Exec(t, `SELECT txid_current()`)
	want := `outbox_db_horizon_holder_pid{kind="backend",wlproj="false",application_name="app-report",state="idle in transaction",slot=""} ` +
		strconv.Itoa(int(holder.PID))
	scrape := waitScrape(t, f, "the holder in the scrape", want)
	require.Equal(t, []string{want}, holderLines(scrape), "one holder series")
	// A reading taken between the snapshot and the transaction after it
	// shows an age of 0: wait for the next.
	harness.Eventually(t, 10*time.Second, "the holder one transaction behind", func() bool {
		scrape = f.get(f.port, "/metrics").raw
		return sample(t, scrape, "outbox_db_horizon_age_transactions") >= 1
	})
	require.Equal(t, []string{want}, holderLines(scrape), "one holder series")
	require.GreaterOrEqual(t, sample(t, scrape, "outbox_db_horizon_age_seconds"), 0.0)
	for _, table := range []string{"outbox_events", "outbox_ledger"} {
		for _, name := range []string{"outbox_table_dead_tuples", "outbox_table_live_tuples", "outbox_table_last_autovacuum_timestamp_seconds"} {
			sample(t, scrape, name+`{table="`+table+`"}`)
		}
	}
	require.Contains(t, scrape, "# HELP outbox_db_horizon_holder_pid "+helpText(t, "outbox_db_horizon_holder_pid"))

	holder.Release()
	none := `outbox_db_horizon_holder_pid{kind="none",wlproj="false",application_name="",state="",slot=""} 0`
	scrape = waitScrape(t, f, "none holds it once the session ends", none)
	require.Equal(t, []string{none}, holderLines(scrape), "the session's series is gone")
	require.Zero(t, sample(t, scrape, "outbox_db_horizon_age_seconds"))
}

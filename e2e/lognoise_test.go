package e2e

// Log noise an operator learns to ignore, checked on real replicas: the
// tests count lines by level and by repetition, never by wording.

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/tcpproxy"
)

// levelLine is the part of a replica's JSON log line these tests read.
type levelLine struct {
	Level   string `json:"level"`
	Service string `json:"service"`
	Message string `json:"message"`
}

// logLines parses a replica's log, skipping whatever is not JSON.
func logLines(logs string) []levelLine {
	var lines []levelLine
	for raw := range strings.SplitSeq(logs, "\n") {
		var l levelLine
		if json.Unmarshal([]byte(raw), &l) == nil && l.Level != "" {
			lines = append(lines, l)
		}
	}
	return lines
}

// repeatedWarnings are the warn and error lines one service logged more
// than once among lines, with their counts. Each of the leader's services
// saying its round failed is one line each, not a repetition.
func repeatedWarnings(lines []levelLine) map[string]int {
	seen := map[string]int{}
	for _, l := range lines {
		if l.Level == "warn" || l.Level == "error" {
			seen[l.Service+": "+l.Level+": "+l.Message]++
		}
	}
	for k, n := range seen {
		if n == 1 {
			delete(seen, k)
		}
	}
	return seen
}

// A database that refuses connections for 10 s (stopped, not partitioned:
// every attempt fails at once) is an outage each replica logs once: every
// warning or error it causes appears once, where a leadership attempt
// failed twice a second, each a warning, before. A line counts as
// repeated when the same service logs it again.
func TestLogsADatabaseOutageOncePerReplica(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	u, err := url.Parse(c.db.URL)
	require.NoError(t, err)
	pg := tcpproxy.Start(t, u.Host)
	u.Host = pg.Addr()
	c.env = append(c.env, "DATABASE_URL="+u.String())
	a, b := c.start("a"), c.start("b")
	c.leader()
	c.produce(20, 2)
	c.drained(30 * time.Second)
	before := map[string]int{"a": len(logLines(a.Logs())), "b": len(logLines(b.Logs()))}

	pg.Refuse()
	time.Sleep(10 * time.Second)
	pg.Restore()
	opWaitReady(t, a, http.StatusOK, 30*time.Second)
	opWaitReady(t, b, http.StatusOK, 30*time.Second)
	c.leader()
	c.produce(20, 2)
	c.settle(60 * time.Second)

	for name, r := range map[string]interface{ Logs() string }{"a": a, "b": b} {
		during := logLines(r.Logs())[before[name]:]
		require.Empty(t, repeatedWarnings(during), "replica %s repeated warnings during a 10 s outage", name)
	}
}

package leader

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/internal/testkit/tcpproxy"
)

// logBuffer collects an elector's JSON log lines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// levels are the log's lines, each as its level and whether it carries a
// failed_attempts field; the tests look at levels and fields, not wording.
func (b *logBuffer) levels(t *testing.T) (levels []string, withAttempts int) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	for line := range strings.SplitSeq(strings.TrimSpace(b.buf.String()), "\n") {
		if line == "" {
			continue
		}
		var l struct {
			Level    string `json:"level"`
			Attempts *int   `json:"failed_attempts"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &l), line)
		levels = append(levels, l.Level)
		if l.Attempts != nil && l.Level == "info" {
			withAttempts++
		}
	}
	return levels, withAttempts
}

func count(levels []string, level string) int {
	n := 0
	for _, l := range levels {
		if l == level {
			n++
		}
	}
	return n
}

// A streak of failed attempts, one every half second for 150 s, is logged
// as its start, a reminder each minute, and its end; the next streak is
// logged again.
func TestAttemptLogLogsAStreakOnce(t *testing.T) {
	var buf logBuffer
	log := zerolog.New(&buf)
	var a attemptLog
	start := time.Unix(1_700_000_000, 0)
	for i := range 300 {
		a.failed(log, errors.New("connection refused"), start.Add(time.Duration(i)*500*time.Millisecond))
	}
	a.reached(log, start.Add(150*time.Second))
	a.reached(log, start.Add(151*time.Second))
	levels, ended := buf.levels(t)
	require.Equal(t, 3, count(levels, "warn"), "the first failure and a reminder at 60 s and 120 s: %v", levels)
	require.Equal(t, 1, ended, "one line says the streak ended")
	require.Len(t, levels, 4)

	a.failed(log, errors.New("connection refused"), start.Add(200*time.Second))
	levels, _ = buf.levels(t)
	require.Equal(t, 4, count(levels, "warn"), "a new streak is logged")
}

// runLoggedElector runs an elector named id on dbURL, with quick retries,
// logging into buf, with one service that runs while it leads; canLead,
// if not nil, is its CanLead.
func runLoggedElector(t *testing.T, dbURL, id string, buf *logBuffer, canLead func() bool) *Elector {
	t.Helper()
	e, err := New(Config{DatabaseURL: dbURL, Name: "test", WorkerID: id, CheckInterval: 50 * time.Millisecond,
		TickInterval: 50 * time.Millisecond, RetryInterval: 50 * time.Millisecond, ServerCheckInterval: 200 * time.Millisecond},
		zerolog.New(buf), &replica{done: make(chan struct{})})
	require.NoError(t, err)
	e.CanLead = canLead
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return e
}

// While the database is down, an elector retries every RetryInterval (here
// 50 ms, 40 attempts in 2 s) but warns once, and says once that its
// attempts get through again.
func TestElectorLogsADatabaseOutageOnce(t *testing.T) {
	t.Parallel()
	db := harness.NewDatabase(t)
	u, err := url.Parse(db.URL)
	require.NoError(t, err)
	pg := tcpproxy.Start(t, u.Host)
	u.Host = pg.Addr()
	var buf logBuffer
	e := runLoggedElector(t, u.String(), "outage", &buf, nil)
	harness.Eventually(t, 10*time.Second, "it leads", func() bool { return e.State().Role == RoleLeader })

	pg.Refuse()
	harness.Eventually(t, 5*time.Second, "it stepped down", func() bool { return e.State().Role == RoleStandby })
	time.Sleep(2 * time.Second)
	pg.Restore()
	harness.Eventually(t, 10*time.Second, "it leads again", func() bool { return e.State().Role == RoleLeader })

	levels, ended := buf.levels(t)
	require.Equal(t, 1, count(levels, "error"), "losing the lease: %v", levels)
	require.Equal(t, 1, count(levels, "warn"), "one warning for the failed attempts: %v", levels)
	require.Equal(t, 1, ended, "one line says the attempts get through again")
}

// Waiting until it may lead, as every replica does at start until its
// first schema read, is not worth a warning: the check that says no logs
// why.
func TestElectorWaitingToLeadDoesNotWarn(t *testing.T) {
	t.Parallel()
	db := harness.NewDatabase(t)
	var may atomic.Bool
	var buf logBuffer
	e := runLoggedElector(t, db.URL, "waits", &buf, may.Load)
	time.Sleep(200 * time.Millisecond)
	may.Store(true)
	harness.Eventually(t, 10*time.Second, "it leads", func() bool { return e.State().Role == RoleLeader })
	levels, _ := buf.levels(t)
	require.Zero(t, count(levels, "warn")+count(levels, "error"), "%s", buf.buf.String())
}

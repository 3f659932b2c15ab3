package harness

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Quick are the settings of a replica under test: short polls, backoffs,
// checks and grace, so a retry or a failover takes a fraction of a second.
var Quick = []string{
	"OUTBOX_POLL_INTERVAL_SECONDS=0.2",
	"OUTBOX_RECLAIM_INTERVAL_SECONDS=0.5",
	"OUTBOX_BASE_BACKOFF_SECONDS=0.2",
	"OUTBOX_MAX_BACKOFF_SECONDS=1",
	"OUTBOX_LEADER_CHECK_INTERVAL_SECONDS=0.1",
	"OUTBOX_SHUTDOWN_GRACE_SECONDS=5",
	"ELASTIC_TIMEOUT_SECONDS=5",
	"OUTBOX_UNKNOWN_PROJECTION_WAIT=1s",
}

// ReplicaEnv is the environment of a replica draining dbURL into index on
// the engine at elasticURL, competing under the index's name (unique per
// test or run), then settings: VAR=value, a later one winning.
func ReplicaEnv(dbURL, elasticURL, index string, settings ...string) []string {
	return append([]string{
		"DATABASE_URL=" + dbURL,
		"ELASTIC_URL=" + elasticURL,
		"ELASTIC_INDEX=" + index,
		"OUTBOX_LEADER_NAME=" + index,
		"LOG_LEVEL=info",
	}, settings...)
}

// Replica is one running `wlproj run`.
type Replica struct {
	Name     string
	HTTPPort int
	cmd      *exec.Cmd
	logs     *syncBuffer
	exited   chan struct{}
	exitErr  error
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	tee io.Writer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tee != nil {
		_, _ = b.tee.Write(p)
	}
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Start runs bin as `wlproj run` with worker id name and env added to the
// current environment. Its output is kept (and copied to tee if not nil).
func Start(bin, name string, env []string, tee io.Writer) (*Replica, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	r := &Replica{Name: name, HTTPPort: port, logs: &syncBuffer{tee: tee}, exited: make(chan struct{})}
	r.cmd = exec.Command(bin, "run")
	r.cmd.Env = append(append(os.Environ(), env...),
		"OUTBOX_WORKER_ID="+name, "OUTBOX_HTTP_PORT="+strconv.Itoa(port), "OUTBOX_METRICS_PORT=0")
	r.cmd.Stdout, r.cmd.Stderr = r.logs, r.logs
	// Its own process group, so a kill reaches nothing else.
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := r.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { r.exitErr = r.cmd.Wait(); close(r.exited) }()
	return r, nil
}

// StartReplica is Start for tests: the test's binary, stopped when the test
// ends, its output logged if the test failed.
func StartReplica(t testing.TB, name string, env []string) *Replica {
	t.Helper()
	r, err := Start(Binary(t), name, env, nil)
	require.NoError(t, err)
	t.Cleanup(func() {
		r.Stop(10 * time.Second)
		if t.Failed() {
			logs := r.Logs()
			t.Logf("logs of %s:\n%s", r.Name, logs[max(0, len(logs)-4000):])
		}
	})
	return r
}

// Healthy waits until every replica serves /healthz.
func Healthy(t testing.TB, rs ...*Replica) {
	t.Helper()
	for _, r := range rs {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err := r.WaitHealthy(ctx)
		cancel()
		require.NoError(t, err)
	}
}

// Logs is everything the process printed so far: for people, not asserts.
func (r *Replica) Logs() string { return r.logs.String() }

// Pid is the process id.
func (r *Replica) Pid() int { return r.cmd.Process.Pid }

// Get fetches path from the replica's HTTP port. The client waits longer
// than a readiness probe's own 2 s timeout.
func (r *Replica) Get(path string) (int, []byte, error) {
	client := http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get("http://127.0.0.1:" + strconv.Itoa(r.HTTPPort) + path)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

// Signal sends sig to the process.
func (r *Replica) Signal(sig syscall.Signal) error { return r.cmd.Process.Signal(sig) }

// Kill is kill -9; it returns once the process is gone.
func (r *Replica) Kill() { _ = r.cmd.Process.Kill(); <-r.exited }

// Alive reports whether the process still runs.
func (r *Replica) Alive() bool {
	select {
	case <-r.exited:
		return false
	default:
		return true
	}
}

// ExitCode waits up to timeout and returns the exit code.
func (r *Replica) ExitCode(timeout time.Duration) (int, error) {
	select {
	case <-r.exited:
		return r.cmd.ProcessState.ExitCode(), nil
	case <-time.After(timeout):
		return -1, fmt.Errorf("%s still running after %s", r.Name, timeout)
	}
}

// Stop ends the process whatever its state: SIGCONT (in case it was
// stopped), SIGTERM, then SIGKILL after timeout.
func (r *Replica) Stop(timeout time.Duration) {
	if !r.Alive() {
		return
	}
	_ = r.cmd.Process.Signal(syscall.SIGCONT)
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.exited:
	case <-time.After(timeout):
		r.Kill()
	}
}

// WaitHealthy waits until /healthz answers; it gives up at once if the
// process exits.
func (r *Replica) WaitHealthy(ctx context.Context) error {
	err := Poll(ctx, time.Hour, r.Name+" to serve /healthz", func(context.Context) (bool, error) {
		if !r.Alive() {
			return false, Fatal(fmt.Errorf("%s exited: %v", r.Name, r.exitErr))
		}
		_, err := r.Health()
		return err == nil, err
	})
	if err != nil {
		return fmt.Errorf("%w\n%s", err, r.Logs())
	}
	return nil
}

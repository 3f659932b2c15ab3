// Package replica drives real `wlproj run` processes the way an operator
// would: start with an environment, read /healthz, kill -9, SIGTERM, SIGSTOP.
// Tests, the drill and the benchmarks share it.
package replica

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// FreePort returns a loopback port that was free a moment ago.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
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

// Start runs bin as `wlproj run` named name, with env added to the current
// environment. Its stdout and stderr are kept (and copied to tee if not nil).
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
	// Its own process group, so a test's kill reaches nothing else.
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := r.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { r.exitErr = r.cmd.Wait(); close(r.exited) }()
	return r, nil
}

// Logs returns everything the process printed so far.
func (r *Replica) Logs() string { return r.logs.String() }

// Pid is the process id.
func (r *Replica) Pid() int { return r.cmd.Process.Pid }

// Health is the /healthz body.
type Health struct {
	Status   string `json:"status"`
	Role     string `json:"role"`
	WorkerID string `json:"worker_id"`
	Epoch    int64  `json:"epoch"`
}

// Get fetches path from the replica's HTTP port.
func (r *Replica) Get(path string) (int, []byte, error) {
	client := http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get("http://127.0.0.1:" + strconv.Itoa(r.HTTPPort) + path)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

// Health reads /healthz.
func (r *Replica) Health() (Health, error) {
	var h Health
	_, body, err := r.Get("/healthz")
	if err != nil {
		return h, err
	}
	err = json.Unmarshal(body, &h)
	return h, err
}

// IsLeader reports whether /healthz says leader.
func (r *Replica) IsLeader() bool {
	h, err := r.Health()
	return err == nil && h.Role == "leader"
}

// Signal sends sig to the process.
func (r *Replica) Signal(sig syscall.Signal) error { return r.cmd.Process.Signal(sig) }

// Kill is kill -9.
func (r *Replica) Kill() { _ = r.cmd.Process.Kill(); <-r.exited }

// Exited is closed when the process has exited.
func (r *Replica) Exited() <-chan struct{} { return r.exited }

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
	select {
	case <-r.exited:
		return
	default:
	}
	_ = r.cmd.Process.Signal(syscall.SIGCONT)
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.exited:
	case <-time.After(timeout):
		r.Kill()
	}
}

// WaitHealthy waits until /healthz answers.
func (r *Replica) WaitHealthy(ctx context.Context) error {
	for {
		if _, err := r.Health(); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s never served /healthz: %w\n%s", r.Name, ctx.Err(), r.Logs())
		case <-r.exited:
			return fmt.Errorf("%s exited: %v\n%s", r.Name, r.exitErr, r.Logs())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

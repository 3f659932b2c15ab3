package harness

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// PGPair is a Postgres cluster of a test's own with a streaming standby,
// both on loopback, as scripts/stack.sh's PG_STANDBY=1 starts them: the
// standby is a pg_basebackup -R copy, and the primary's commits wait for it
// and apply it (synchronous_standby_names, remote_apply), so a promotion
// loses no commit a client saw.
// The stack's Postgres is shared by every test and cannot be killed; this
// pair can.
type PGPair struct {
	Primary, Standby PGNode

	bindir string
	cred   *syscall.Credential // the stack's unprivileged user, when root
	dir    string
}

// PGNode is one server of a PGPair.
type PGNode struct {
	Port int
	Data string
}

// Addr is the node's host:port.
func (n PGNode) Addr() string { return "127.0.0.1:" + strconv.Itoa(n.Port) }

// StartPGPair starts a primary and its synchronous standby, stopped and
// removed when the test ends. The binaries are the stack's
// (STACK_PG_BINDIR); run as the stack's user (STACK_RUN_USER) when root,
// since Postgres refuses to run as root.
func StartPGPair(t testing.TB) *PGPair {
	t.Helper()
	p := newPGPair(t)
	p.startStandby(t)
	return p
}

// StartPGAlone starts a primary of its own without a standby, stopped and
// removed when the test ends: for a test that must see the vacuum horizon
// of its database alone. On the stack's server every other package's tests
// run at once, and a transaction of theirs that holds an xid for seconds
// bounds the xmin of every snapshot taken meanwhile, in every database: the
// test's own sessions then hold its horizon back on their behalf.
func StartPGAlone(t testing.TB) *PGPair {
	t.Helper()
	return newPGPair(t)
}

// newPGPair makes the cluster's directory and starts its primary.
func newPGPair(t testing.TB) *PGPair {
	t.Helper()
	env := StackEnv(t)
	p := &PGPair{bindir: env["STACK_PG_BINDIR"]}
	if p.bindir == "" {
		p.bindir = "/usr/lib/postgresql/15/bin"
	}
	require.FileExists(t, filepath.Join(p.bindir, "initdb"), "a Postgres standby needs the server binaries (STACK_PG_BINDIR)")
	dir, err := os.MkdirTemp("", "wlproj-pgpair.")
	require.NoError(t, err)
	p.dir = dir
	t.Cleanup(p.close)
	require.NoError(t, os.Chmod(dir, 0o755))
	if os.Geteuid() == 0 {
		uid, gid, err := lookupUser(env["STACK_RUN_USER"])
		require.NoError(t, err, "Postgres does not run as root: the stack's user (STACK_RUN_USER) runs it")
		require.NoError(t, os.Chown(dir, int(uid), int(gid)))
		p.cred = &syscall.Credential{Uid: uid, Gid: gid}
	}
	p.Primary.Data = filepath.Join(dir, "primary")
	p.Standby.Data = filepath.Join(dir, "standby")
	for _, n := range []*PGNode{&p.Primary, &p.Standby} {
		n.Port, err = FreePort()
		require.NoError(t, err)
	}

	p.run(t, "initdb", "-D", p.Primary.Data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync")
	// remote_apply, not on: a test lists the standby first, and pgx stops at
	// a host that says the database does not exist (3D000) instead of trying
	// the next, which a standby that has the CREATE DATABASE flushed but not
	// applied would.
	// A statement slower than a second and a lock waited on for half of
	// one are logged, and shown when the test fails: what held it up.
	p.start(t, p.Primary, "-c synchronous_commit=remote_apply -c log_min_duration_statement=1s"+
		" -c log_lock_waits=on -c deadlock_timeout=500ms", "primary")
	t.Cleanup(func() { p.logSlow(t) }) // before close, which removes the log
	return p
}

// logSlow shows the primary's log lines about slow statements and lock
// waits when the test failed.
func (p *PGPair) logSlow(t testing.TB) {
	if !t.Failed() {
		return
	}
	log, err := os.ReadFile(filepath.Join(p.dir, "primary.log"))
	if err != nil {
		return
	}
	var slow []string
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(line, "duration:") || strings.Contains(line, "lock") {
			slow = append(slow, line)
		}
	}
	t.Logf("the primary's slow statements and lock waits (%d lines, the last 40):\n%s",
		len(slow), strings.Join(slow[max(len(slow)-40, 0):], "\n"))
}

// startStandby makes the standby of the running primary and waits until it
// streams synchronously.
func (p *PGPair) startStandby(t testing.TB) {
	t.Helper()
	p.run(t, "pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(p.Primary.Port), "-U", "postgres",
		"-D", p.Standby.Data, "-R", "-X", "stream", "-c", "fast", "--no-sync")
	// cluster_name is the walreceiver's application_name, which
	// synchronous_standby_names names.
	p.start(t, p.Standby, "-c wal_retrieve_retry_interval=200ms -c cluster_name=standby", "standby")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := p.nodeURL(p.Primary)
	Eventually(t, 20*time.Second, "the standby to stream", func() bool {
		var state string
		err := queryOnce(ctx, admin, `SELECT state FROM pg_stat_replication WHERE application_name = 'standby'`, &state)
		return err == nil && state == "streaming"
	})
	require.NoError(t, queryOnce(ctx, admin, `ALTER SYSTEM SET synchronous_standby_names = 'standby'`, nil))
	require.NoError(t, queryOnce(ctx, admin, `SELECT pg_reload_conf()`, nil))
	Eventually(t, 10*time.Second, "the standby to be synchronous", func() bool {
		var state string
		err := queryOnce(ctx, admin, `SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby'`, &state)
		return err == nil && state == "sync"
	})
}

// URL is a superuser's URL naming the hosts in order, with extra query
// parameters (e.g. "target_session_attrs=read-write").
func (p *PGPair) URL(hosts []string, query ...string) string {
	return "postgres://postgres@" + strings.Join(hosts, ",") + "/postgres?" + strings.Join(append([]string{"sslmode=disable"}, query...), "&")
}

// nodeURL is a superuser's URL of n alone.
func (p *PGPair) nodeURL(n PGNode) string { return p.URL([]string{n.Addr()}) }

// NewDatabase creates a migrated database on the primary through adminURL
// (one of p.URL's), dropped when the test ends, with a pool on that URL.
func (p *PGPair) NewDatabase(t testing.TB, adminURL string) DB {
	t.Helper()
	ctx := context.Background()
	db := DB{Name: UniqueName("wlproj_t_")}
	var err error
	db.URL, err = CreateDatabase(ctx, adminURL, db.Name)
	require.NoError(t, err)
	db.Pool, err = pgxpool.New(ctx, db.URL)
	require.NoError(t, err)
	t.Cleanup(db.Pool.Close)
	return db
}

// InRecovery says whether n is a standby.
func (p *PGPair) InRecovery(ctx context.Context, n PGNode) (bool, error) {
	var in bool
	err := queryOnce(ctx, p.nodeURL(n), `SELECT pg_is_in_recovery()`, &in)
	return in, err
}

// KillPrimary kills the primary's postmaster with SIGKILL, as a crashed
// host would: its backends end as they notice, nothing is shut down cleanly.
func (p *PGPair) KillPrimary() error {
	b, err := os.ReadFile(filepath.Join(p.Primary.Data, "postmaster.pid"))
	if err != nil {
		return err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		return fmt.Errorf("postmaster.pid: %w", err)
	}
	return syscall.Kill(pid, syscall.SIGKILL)
}

// Promote makes the standby the primary (pg_ctl promote -w). It has no
// synchronous standby of its own, so its commits wait for no one.
func (p *PGPair) Promote(t testing.TB) {
	t.Helper()
	p.run(t, "pg_ctl", "-D", p.Standby.Data, "promote", "-w", "-t", "30")
}

func (p *PGPair) start(t testing.TB, n PGNode, opts, name string) {
	t.Helper()
	p.run(t, "pg_ctl", "-D", n.Data, "-l", filepath.Join(p.dir, name+".log"), "-w", "-t", "30", "-o",
		fmt.Sprintf("-p %d -c listen_addresses=127.0.0.1 -k %s -c fsync=off -c full_page_writes=off -c max_connections=100 %s",
			n.Port, p.dir, opts), "start")
}

// run runs a Postgres binary as the cluster's user; its output goes to the
// test's log on failure.
func (p *PGPair) run(t testing.TB, bin string, args ...string) {
	t.Helper()
	out, err := p.cmd(bin, args...).CombinedOutput()
	require.NoError(t, err, "%s %s: %s", bin, strings.Join(args, " "), bytes.TrimSpace(out))
}

func (p *PGPair) cmd(bin string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(p.bindir, bin), args...)
	cmd.Dir = p.dir
	cmd.Env = append(os.Environ(), "HOME="+p.dir)
	// Its own process group: a Ctrl-C meant for go test must not stop a
	// pg_ctl half way.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: p.cred}
	return cmd
}

// close stops both servers, whatever state the test left them in, and
// removes their data: no process is left behind.
func (p *PGPair) close() {
	for _, n := range []PGNode{p.Primary, p.Standby} {
		if n.Data == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(n.Data, "postmaster.pid")); err == nil {
			_ = p.cmd("pg_ctl", "-D", n.Data, "-m", "immediate", "-w", "-t", "30", "stop").Run()
		}
	}
	_ = os.RemoveAll(p.dir)
}

// queryOnce runs sql on a connection of its own and scans one value into
// dest, if any.
func queryOnce(ctx context.Context, url, sql string, dest any) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if dest == nil {
		_, err = conn.Exec(ctx, sql)
		return err
	}
	return conn.QueryRow(ctx, sql).Scan(dest)
}

package cli

import (
	"bytes"
	"context"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// With several hosts in DATABASE_URL, status names the one it reached, not
// the first of the list (after a failover, the first is the dead primary).
func TestDatabaseTargetIsTheHostReached(t *testing.T) {
	t.Parallel()
	db := harness.NewDatabase(t)
	cfg, err := pgx.ParseConfig(db.URL)
	require.NoError(t, err)
	closed, err := harness.FreePort()
	require.NoError(t, err)
	u, err := url.Parse(db.URL)
	require.NoError(t, err)
	reached := u.Host
	u.Host = "127.0.0.1:" + strconv.Itoa(closed) + "," + reached
	q := u.Query()
	q.Set("target_session_attrs", "read-write")
	u.RawQuery = q.Encode()

	conn, err := connect(context.Background(), u.String())
	require.NoError(t, err)
	defer conn.Close(context.Background())
	require.Equal(t, cfg.Host+":"+strconv.Itoa(int(cfg.Port))+"/"+db.Name, databaseTarget(conn))
	require.False(t, strings.Contains(databaseTarget(conn), strconv.Itoa(closed)))
}

func TestConnectRefusesSeveralHostsWithoutReadWrite(t *testing.T) {
	t.Parallel()
	_, err := connect(context.Background(), "postgres://u@127.0.0.1:1,127.0.0.1:2/db")
	require.ErrorContains(t, err, "DATABASE_URL: names 2 hosts (127.0.0.1:1, 127.0.0.1:2) but not target_session_attrs=read-write")
	require.Equal(t, exitUsage, codeOf(err), "bad input, nothing tried")
}

// ambiguousURLs are database URLs that pgx would cut elsewhere than their
// writer meant, or that do not parse, each with the password "Zq7" +
// "SECRETxy" written raw. Before CheckURL, the first one's "SECRETxy@…"
// became the host that every error printed.
var ambiguousURLs = []string{
	"postgres://u:Zq7@SECRETxy@127.0.0.1:1/db",
	"postgresql://u:Zq7/SECRETxy@127.0.0.1:1/db",
	"postgres://u:Zq7#SECRETxy@127.0.0.1:1/db",
	"postgres://u:Zq7 SECRETxy@127.0.0.1:1/db",
	"postgres://u@127.0.0.1:1/db?password=Zq7&SECRETxy",
	"host=127.0.0.1 port=1 password=Zq7 SECRETxy",
}

// requiredArgs are what a command needs besides its database to get as far
// as checking it; a new command that needs more fails the test below.
var requiredArgs = map[string][]string{
	"failed archive": {"--older-than", "30d"},
	"doc":            {"book:1"},
}

// TestEveryCommandRefusesAnAmbiguousURL: every command with a database,
// given an ambiguous or unparsable URL in DATABASE_URL or --database-url,
// exits with the bad-input code before anything connects, names where the
// URL came from, and prints no piece of the password.
func TestEveryCommandRefusesAnAmbiguousURL(t *testing.T) {
	t.Parallel()
	bin := harness.Binary(t)
	commands := databaseCommands(t)
	require.Contains(t, commands, "run")
	require.Contains(t, commands, "verify")
	for _, command := range commands {
		args := append(strings.Fields(command), requiredArgs[command]...)
		for _, bad := range ambiguousURLs {
			// Before CheckURL, run took such a URL and retried it for ever.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			cmd := exec.CommandContext(ctx, bin, args...)
			cmd.Env = append(os.Environ(), "DATABASE_URL="+bad)
			out, err := cmd.CombinedOutput()
			cancel()
			var exit *exec.ExitError
			head := string(out[:min(len(out), 1000)])
			require.ErrorAs(t, err, &exit, "%s with %s: %s", command, bad, head)
			require.Equal(t, exitUsage, exit.ExitCode(), "%s with %s: %s", command, bad, head)
			require.Contains(t, string(out), "DATABASE_URL: ", "%s with %s", command, bad)
			requireNoPassword(t, string(out), command, bad)

			var stdout, stderr bytes.Buffer
			code := Run(append(args, "--database-url", bad), &stdout, &stderr)
			require.Equal(t, exitUsage, code, "%s --database-url %s: %s", command, bad, stderr.String())
			require.Contains(t, stderr.String(), "--database-url: ", "%s --database-url %s", command, bad)
			requireNoPassword(t, stdout.String()+stderr.String(), command, bad)
		}
	}
}

func requireNoPassword(t *testing.T, out, command, url string) {
	t.Helper()
	for _, piece := range []string{"zq7", "secretxy"} {
		require.NotContains(t, strings.ToLower(out), piece, "%s with %s", command, url)
	}
}

// databaseCommands are the commands of the CLI that take --database-url.
func databaseCommands(t *testing.T) []string {
	t.Helper()
	app, err := Model()
	require.NoError(t, err)
	var out []string
	var walk func(n *kong.Node)
	walk = func(n *kong.Node) {
		for _, f := range n.Flags {
			if f.Name == "database-url" {
				out = append(out, n.Path())
			}
		}
		for _, c := range n.Children {
			walk(c)
		}
	}
	walk(app.Node)
	return out
}

package cli

import (
	"bytes"
	"net/url"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// TestRedact: credentials go where they stand, in URLs and password
// settings, and nothing else in the message changes, even words that the
// password is made of or holds.
func TestRedact(t *testing.T) {
	t.Parallel()
	got := redact("dial postgres://u:p%40ss-w0rd@h:5432/db?sslmode=disable failed; also postgres://x:other@y/z")
	require.Equal(t, "dial postgres://h:5432/db?sslmode=disable failed; also postgres://y/z", got)

	require.Equal(t, "bad host=h user=u password=xxxxx dbname=db",
		redact("bad host=h user=u password=hunter22 dbname=db"))
	require.Equal(t, "bad host=h password=xxxxx dbname=db", redact("bad host=h password='hunter 22' dbname=db"))
	require.Equal(t, "cannot parse `postgres://h/db?sslpassword=xxxxx&password=xxxxx`",
		redact("cannot parse `postgres://h/db?sslpassword=k3y&password=pw`"))

	// A password of words that are elsewhere in the message: each word
	// stays where it is not the password.
	const msg = "connect to database: failed to connect to `user=postgres database=postgres`: " +
		"postgres://postgres:database@127.0.0.1:1/postgres: connection refused"
	require.Equal(t, "connect to database: failed to connect to `user=postgres database=postgres`: "+
		"postgres://127.0.0.1:1/postgres: connection refused", redact(msg))
}

func TestOpsSecretsNeverPrinted(t *testing.T) {
	t.Parallel()
	b := opsSetup(t)
	const secret = "s3cr3t-planted"
	// The test server trusts local connections: the password is never checked.
	good := b.db.Login(t, "", secret)
	u, err := url.Parse(good)
	require.NoError(t, err)
	u.Host = u.Hostname() + ":1" // nothing listens on port 1
	unreachable := u.String()
	malformed := "postgres://postgres:" + secret + "@127.0.0.1:notaport/db"
	bin := harness.Binary(t)

	cases := []struct {
		url  string
		args []string
		code int
	}{
		{good, []string{"--help"}, 0},
		{good, []string{"replay", "--help"}, 0},
		{good, []string{"status", "--help"}, 0},
		{good, []string{"failed", "list", "--help"}, 0},
		{good, []string{"status"}, 0},
		{good, []string{"status", "--json"}, 0},
		{good, []string{"failed", "list"}, 0},
		{good, []string{"failed", "list", "--json"}, 0},
		{good, []string{"failed", "stats"}, 0},
		{good, []string{"replay", "--reason", "timeout", "--dry-run", "--by", "a", "--why", "b"}, 0},
		{good, []string{"replay", "--ids", "999999", "--by", "a", "--why", "b"}, exitRefused},
		{good, []string{"replay", "--ids", "1"}, exitUsage},
		{good, []string{"status", "--bogus-flag"}, 2},
		{unreachable, []string{"status"}, exitFailure},
		{unreachable, []string{"failed", "list"}, exitFailure},
		{unreachable, []string{"failed", "stats", "--json"}, exitFailure},
		{unreachable, []string{"replay", "--ids", "1", "--by", "a", "--why", "b"}, exitFailure},
		{malformed, []string{"status"}, exitUsage},
	}
	for _, tc := range cases {
		// Through the environment, as deployed...
		cmd := exec.Command(bin, tc.args...)
		cmd.Env = append(os.Environ(), "DATABASE_URL="+tc.url, "PGCONNECT_TIMEOUT=5")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else {
			require.NoError(t, err)
		}
		require.Equal(t, tc.code, code, "%v\nstdout: %s\nstderr: %s", tc.args, stdout.String(), stderr.String())
		require.NotContains(t, stdout.String(), secret, "%v", tc.args)
		require.NotContains(t, stderr.String(), secret, "%v", tc.args)

		// ...and as a flag, where a command takes one.
		if tc.args[0] == "--help" {
			continue
		}
		var out, errOut bytes.Buffer
		code = Run(append(tc.args, "--database-url", tc.url), &out, &errOut)
		require.Equal(t, tc.code, code, "%v\nstdout: %s\nstderr: %s", tc.args, out.String(), errOut.String())
		require.NotContains(t, out.String(), secret, "%v", tc.args)
		require.NotContains(t, errOut.String(), secret, "%v", tc.args)
		if tc.url == unreachable {
			require.Contains(t, errOut.String(), "connect to database")
		}
	}
}

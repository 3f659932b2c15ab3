package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// Single sign-on settings that cannot work are refused before anything
// connects, by their variables, and the client secret is never shown.
func TestRunRefusesBadSingleSignOnSettings(t *testing.T) {
	t.Parallel()
	const secret = "client-secret-do-not-show"
	secretFile := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(secretFile, []byte(secret), 0o600))
	full := func(issuer, redirect string) []string {
		return []string{"--console-oidc-issuer", issuer, "--console-oidc-client-id", "wlproj",
			"--console-oidc-client-secret-file", secretFile, "--console-oidc-redirect-url", redirect}
	}
	const redirect = "https://wlproj.example/console/oidc/callback"
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--console-oidc-client-id", "wlproj", "--console-oidc-client-secret-file", secretFile},
			"OUTBOX_CONSOLE_OIDC_CLIENT_ID is set, but the console is off: set OUTBOX_CONSOLE_USERS_FILE or OUTBOX_CONSOLE_OIDC_ISSUER"},
		{full("http://sso.example/realms/ops", redirect),
			`OUTBOX_CONSOLE_OIDC_ISSUER "http://sso.example/realms/ops" is not an https:// URL (http:// only on a loopback address)`},
		{full("https://sso.example", "https://wlproj.example/callback"),
			`OUTBOX_CONSOLE_OIDC_REDIRECT_URL "https://wlproj.example/callback" is not the console's public URL followed by /console/oidc/callback`},
		{[]string{"--console-oidc-issuer", "https://sso.example", "--console-oidc-client-secret-file", secretFile},
			"OUTBOX_CONSOLE_OIDC_CLIENT_ID is required for single sign-on"},
		{[]string{"--console-oidc-issuer", "https://sso.example", "--console-oidc-client-id", "wlproj",
			"--console-oidc-redirect-url", redirect}, "OUTBOX_CONSOLE_OIDC_CLIENT_SECRET_FILE is required for single sign-on"},
		{full("https://sso.example", redirect), "OUTBOX_POLICY_FILE is required for single sign-on"},
	} {
		var stdout, stderr bytes.Buffer
		code := Run(append([]string{"run", "--database-url", "postgres://127.0.0.1:1/none"}, c.args...), &stdout, &stderr)
		require.Equal(t, 2, code, "%v: %s", c.args, stderr.String())
		require.Contains(t, stderr.String(), c.want)
		require.NotContains(t, stdout.String()+stderr.String(), secret)
	}
}

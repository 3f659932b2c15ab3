package console

import (
	"net/http"
	"net/http/cookiejar"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// TestSingleSignOnThroughTheBinary: `wlproj run` with the OUTBOX_CONSOLE_OIDC_*
// variables and no users file serves the console, and grace signs in to
// it through Dex: the variables reach the console, and single sign-on
// alone turns it on.
func TestSingleSignOnThroughTheBinary(t *testing.T) {
	t.Parallel()
	db, index := harness.NewDatabase(t), harness.NewIndex(t)
	port := harness.Port(t)
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	p := startDex(t, base, "", 0)
	secret := filepath.Join(t.TempDir(), "oidc-secret")
	require.NoError(t, os.WriteFile(secret, []byte(p.ClientSecret+"\n"), 0o600))
	policyFile := filepath.Join(t.TempDir(), "policy.yaml")
	require.NoError(t, os.WriteFile(policyFile, []byte(ssoPolicy), 0o600))
	env := harness.ReplicaEnv(db.URL, harness.ElasticURL(t), index, slices.Concat(harness.Quick, []string{
		"OUTBOX_CONSOLE_PORT=" + strconv.Itoa(port),
		"OUTBOX_CONSOLE_OIDC_ISSUER=" + p.Issuer,
		"OUTBOX_CONSOLE_OIDC_CLIENT_ID=" + p.ClientID,
		"OUTBOX_CONSOLE_OIDC_CLIENT_SECRET_FILE=" + secret,
		"OUTBOX_CONSOLE_OIDC_REDIRECT_URL=" + base + OIDCCallbackPath,
		"OUTBOX_CONSOLE_OIDC_PROVIDER_NAME=Dex",
		"OUTBOX_POLICY_FILE=" + policyFile,
	})...)
	r := harness.StartReplica(t, "sso-a", env)
	harness.Healthy(t, r)

	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	grace := &client{t: t, base: base, http: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
	require.NotContains(t, grace.get(Prefix+"signin").body, `name="password"`, "no users file: no password form")
	page := grace.ssoSignIn(Prefix)
	require.Equal(t, http.StatusOK, page.code, page.body)
	require.Contains(t, page.body, graceEmail)
	require.Equal(t, 1, db.Int(t, `SELECT count(*) FROM outbox_console_sessions WHERE auth = 'oidc' AND groups = $1`, graceGroups))
}

package console

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// TestBrowserSingleSignOn: single sign-on in Debian's chromium, with Dex
// on another site (localhost) than the console (127.0.0.1), as a real
// provider is. What only a browser enforces is in the way here: the CSP's
// form-action 'self' (a form whose answer redirects to the provider is
// blocked), and the SameSite=Strict session cookie (a browser coming back
// from the provider's site leaves it behind for that whole navigation).
func TestBrowserSingleSignOn(t *testing.T) {
	needChromium(t)
	t.Parallel()
	b := setupOIDCAt(t, "localhost", 0)
	br := newBrowser(t)
	require.Equal(t, http.StatusOK, br.open(b.srv.URL+Prefix+"audit"), "an unsigned visitor lands on the sign-in page")
	br.do(chromedp.Click(chromedp.CSS(`#signin-oidc`)), chromedp.WaitVisible(chromedp.CSS(`#login`)))
	require.True(t, strings.HasPrefix(br.location(), b.dex.Issuer+"/auth"), "at the provider's login: %s", br.location())
	br.do(chromedp.SendKeys(chromedp.CSS(`#login`), graceEmail), chromedp.SendKeys(chromedp.CSS(`#password`), gracePassword),
		chromedp.Click(chromedp.CSS(`#submit-login`)), chromedp.WaitVisible(chromedp.CSS(`#replica`)))
	require.Equal(t, b.srv.URL+Prefix+"audit", br.location(), "back on the page asked for")
	require.Contains(t, br.text("replica"), "This replica")
	who := action(br, "who", chromedp.Evaluate[string](`document.querySelector(".who").textContent`))
	require.Contains(t, who, graceEmail)
	require.Contains(t, who, "read-only")
	require.Equal(t, network.CookieSameSiteStrict, br.sessionCookie(b.srv.URL).SameSite)

	br.do(chromedp.Click(chromedp.CSS(`.signout button`)), chromedp.WaitVisible(chromedp.CSS(`#signin-oidc`)))
	require.Equal(t, 1, b.db.Int(t, `SELECT count(*) FROM outbox_console_sessions WHERE username = $1 AND revoked_at IS NOT NULL`, graceEmail))
}

func (b *browser) location() string {
	b.t.Helper()
	return action(b, "location", chromedp.Evaluate[string](`location.href`))
}

// sessionCookie is the browser's console session cookie for u, as the
// browser keeps it.
func (b *browser) sessionCookie(u string) *network.Cookie {
	b.t.Helper()
	res := run(b, "cookies of "+u, func(ctx context.Context) (network.GetCookiesResult, error) {
		return chromedp.Call(ctx, network.GetCookies, network.GetCookiesParams{URLs: []string{u + Prefix}})
	})
	for _, c := range res.Cookies {
		if c.Name == cookieName {
			return c
		}
	}
	b.t.Fatalf("no %s cookie for %s", cookieName, u)
	return nil
}

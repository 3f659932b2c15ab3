package pgpool

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestParseURLRefusesWhatCouldBeReadTwoWays: each refused URL holds the
// password "Zq7" + "SECRETxy" written raw where pgx would cut it; the error
// says what to percent-encode and holds no piece of it. The accepted ones
// are the same passwords encoded, and what else a URL may hold.
func TestParseURLRefusesWhatCouldBeReadTwoWays(t *testing.T) {
	t.Parallel()
	for url, want := range map[string]string{
		"postgres://u:Zq7@SECRETxy@h:5432/db":              "more than one '@'",
		"postgresql://u:Zq7@SECRETxy@h1,h2/db":             "more than one '@'",
		"postgres://u:Zq7@SECRETxy@h":                      "more than one '@'",
		"postgres://u:Zq7/SECRETxy@h:5432/db":              "an '@' after the host",
		"postgres://u:Zq7/SECRETxy@h":                      "an '@' after the host",
		"postgres://u:Zq7?SECRETxy@h/db":                   "'?', '#' or space",
		"postgres://u:Zq7#SECRETxy@h/db":                   "'?', '#' or space",
		"postgres://u:Zq7 SECRETxy@h/db":                   "'?', '#' or space",
		"postgres://u@h/db?password=Zq7&SECRETxy":          "without '='",
		"postgres://u:p@h/db?sslmode=disable&&SECRETxy":    "without '='",
		"postgres://u:Zq7%zzSECRETxy@h/db":                 "does not parse: failed to parse as URL (invalid percent-encoded token in password)",
		"postgres://u:Zq7SECRETxy@h:port/db":               "does not parse: invalid port",
		"host=h password=Zq7 SECRETxy dbname=db":           "does not parse as keyword=value settings",
		"host=h password='Zq7 SECRETxy dbname=db":          "does not parse as keyword=value settings",
		"postgres://u:Zq7SECRETxy@h1:5432,h2:5432/db":      "names 2 hosts (h1:5432, h2:5432) but not target_session_attrs=read-write",
		"postgres://u:Zq7SECRETxy@h/db?sslmode=bogus":      "does not parse: failed to configure TLS (sslmode is invalid)",
		"postgres://u:Zq7SECRETxy@h/db?connect_timeout=x1": "does not parse: invalid connect_timeout",
	} {
		_, err := ParseURL(url)
		var urlErr *URLError
		require.ErrorAs(t, err, &urlErr, url)
		require.ErrorContains(t, err, "DatabaseURL ", url)
		require.ErrorContains(t, err, want, url)
		for _, piece := range []string{"zq7", "secretxy"} {
			require.NotContains(t, strings.ToLower(err.Error()), piece, url)
		}
		_, err = Open(context.Background(), url, 1, "test")
		require.ErrorAs(t, err, &urlErr, "Open refuses it too: %s", url)
	}

	for url, password := range map[string]string{
		"postgres://u:Zq7%40SECRETxy@h:5432/db":                                       "Zq7@SECRETxy",
		"postgres://u:Zq7%2FSECRETxy@h/db":                                            "Zq7/SECRETxy",
		"postgres://u:Zq7%3F%23%20SECRETxy@h/db":                                      "Zq7?# SECRETxy",
		"postgresql://u:a:b!$&'()*+,;=@h1:5432,h2/db?target_session_attrs=read-write": "a:b!$&'()*+,;=",
		"postgres://u@h/db?password=Zq7%26SECRETxy&sslmode=disable":                   "Zq7&SECRETxy",
		"postgres://u:pw@h/db?application_name=ops@host":                              "pw",
		"postgres://u:pw@h?sslmode=disable":                                           "pw",
		"host=h password='Zq7 SECRETxy' dbname=db":                                    "Zq7 SECRETxy",
	} {
		cfg, err := ParseURL(url)
		require.NoError(t, err, url)
		require.Equal(t, password, cfg.Password, url)
	}
}

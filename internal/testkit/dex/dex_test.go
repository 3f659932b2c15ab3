package dex

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestStartAnswersDiscoveryThenStops checks that Start returns a provider
// whose discovery names its issuer, and that the cleanup stops it.
func TestStartAnswersDiscoveryThenStops(t *testing.T) {
	var p *Provider
	t.Run("running", func(t *testing.T) {
		p = Start(t, Config{RedirectURIs: []string{"http://127.0.0.1:1/cb"},
			Users: []User{{Email: "ada@example.com", Password: "pw", Username: "ada", Groups: []string{"ops"}}}})
		resp, err := http.Get(p.Issuer + "/.well-known/openid-configuration")
		require.NoError(t, err)
		defer resp.Body.Close()
		var doc struct {
			Issuer string `json:"issuer"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&doc))
		require.Equal(t, p.Issuer, doc.Issuer)
	})
	_, err := http.Get(p.Issuer + "/.well-known/openid-configuration")
	require.Error(t, err, "dex still answers after its test ended")
}

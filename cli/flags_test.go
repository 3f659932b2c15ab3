package cli

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

// A malformed API key, or one given with basic auth, is refused before
// anything connects, in the operator's variables, and the key is not shown.
func TestRunRefusesABadAPIKey(t *testing.T) {
	t.Parallel()
	const secret = "Zm9vYmFyc2VjcmV0LW5vLWNvbG9u!"
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--elastic-api-key", secret},
			`ELASTIC_API_KEY must be the id:key pair or its base64 form`},
		{[]string{"--elastic-api-key", "id:" + secret, "--elastic-username", "elastic"},
			"ELASTIC_API_KEY cannot be used with ELASTIC_USERNAME or ELASTIC_PASSWORD: use one way to authenticate"},
		{[]string{"--elastic-api-key", "id:" + secret, "--elastic-password", "pw"},
			"ELASTIC_API_KEY cannot be used with ELASTIC_USERNAME or ELASTIC_PASSWORD: use one way to authenticate"},
	} {
		var stdout, stderr bytes.Buffer
		code := Run(append([]string{"run", "--database-url", "postgres://127.0.0.1:1/none"}, c.args...), &stdout, &stderr)
		require.Equal(t, 2, code, "%v: %s", c.args, stderr.String())
		require.Contains(t, stderr.String(), c.want)
		require.NotContains(t, stdout.String()+stderr.String(), secret)
	}
}

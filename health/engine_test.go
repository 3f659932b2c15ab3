package health

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/classify"
)

// The engine check says "unreachable" only when no answer came: refused
// credentials are an answer, and say so.
func TestEngineText(t *testing.T) {
	t.Parallel()
	refused := classify.New(classify.Connection, "dial tcp 127.0.0.1:9200: connect: connection refused")
	require.Equal(t, "unreachable: https://es:9200: connection: dial tcp 127.0.0.1:9200: connect: connection refused",
		engineText(fmt.Errorf("https://es:9200: %w", refused)))

	auth := classify.FromBulkItem(401, "security_exception", "unable to authenticate user [wlproj]")
	require.Equal(t, "answered 401: opensearch 2.19.6 at https://es:9200: auth_error: elasticsearch 401 security_exception: unable to authenticate user [wlproj]",
		engineText(fmt.Errorf("opensearch 2.19.6 at https://es:9200: %w", auth)))
}

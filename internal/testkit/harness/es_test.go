package harness

import (
	"context"
	"fmt"
	"net/http"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDeleteIndex deletes an alias's index, the rebuild's timestamped ones
// beside it, and a plain index, by concrete names (Elasticsearch 8 refuses
// deletes by wildcard); unknown names are no error.
func TestDeleteIndex(t *testing.T) {
	t.Parallel()
	ctx, base := context.Background(), ElasticURL(t)
	alias, plain := NewIndexName(t), NewIndexName(t)
	for _, name := range []string{alias + "-20260101-000000-000", alias + "-20260102-000000-000", plain} {
		require.NoError(t, CreateIndex(ctx, base, name))
	}
	body := []byte(fmt.Sprintf(`{"actions": [{"add": {"index": %q, "alias": %q}}]}`, alias+"-20260102-000000-000", alias))
	require.NoError(t, ES(ctx, base, http.MethodPost, "/_aliases", body, nil))

	require.NoError(t, DeleteIndex(ctx, base, alias, plain, "wlproj-t-never-made"))
	for _, name := range []string{alias, alias + "-20260101-000000-000", alias + "-20260102-000000-000", plain} {
		err := ES(ctx, base, http.MethodGet, "/"+name, nil, nil)
		var se *StatusError
		require.ErrorAs(t, err, &se, name)
		require.Equal(t, http.StatusNotFound, se.Code, name)
	}
	require.NoError(t, DeleteIndex(ctx, base, alias), "nothing left is no error")
}

// TestESNodeListSkipsARefusingNode: with ELASTIC_URL listing nodes, a node
// that refuses connections (killed) is passed over for the next one.
func TestESNodeListSkipsARefusingNode(t *testing.T) {
	t.Parallel()
	port, err := FreePort()
	require.NoError(t, err)
	down := fmt.Sprintf("http://127.0.0.1:%d", port)
	var health struct {
		Status string `json:"status"`
	}
	require.NoError(t, ES(context.Background(), down+","+ElasticURL(t), http.MethodGet, "/_cluster/health", nil, &health))
	require.NotEmpty(t, health.Status)
	require.ErrorIs(t, ES(context.Background(), down, http.MethodGet, "/_cluster/health", nil, nil), syscall.ECONNREFUSED)
}

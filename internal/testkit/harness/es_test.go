package harness

import (
	"context"
	"fmt"
	"net/http"
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

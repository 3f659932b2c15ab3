package projection

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/olivere/elastic/v7"
	"github.com/stretchr/testify/require"
)

// The body written from the payload's bytes says what olivere's requests
// said, line for line, whatever the id holds.
func TestBulkBodySameAsOlivere(t *testing.T) {
	t.Parallel()
	ids := []string{"book:1", `book:"quoted"\back`, "book:<a>&b", "book:tab\there", "book:ünï", "book:\xff\xfe", "book:\u2028"}
	doc := []byte(`{"title": "x", "n": 1}`)
	for _, id := range ids {
		for _, op := range []string{actionIndex, actionDelete} {
			a := bulkAction{op: op, id: id, version: 1234567890123, doc: doc}
			var want []string
			if op == actionIndex {
				want, _ = elastic.NewBulkIndexRequest().Id(id).Version(a.version).VersionType(versionType).Doc(json.RawMessage(doc)).Source()
			} else {
				want, _ = elastic.NewBulkDeleteRequest().Id(id).Version(a.version).VersionType(versionType).Source()
			}
			var b strings.Builder
			a.writeTo(&b)
			body := b.String()
			require.True(t, strings.HasSuffix(body, "\n"), "%q: a bulk body ends every line", body)
			got := strings.Split(strings.TrimSuffix(body, "\n"), "\n")
			require.Len(t, got, len(want), "%q", body)
			for k := range want {
				var g, w any
				require.NoError(t, json.Unmarshal([]byte(got[k]), &g), "%q", got[k])
				require.NoError(t, json.Unmarshal([]byte(want[k]), &w))
				require.Equal(t, w, g, "id %q, line %d", id, k)
			}
			require.LessOrEqual(t, len(body), a.size()+5*len(id), "size() estimates the body within the id's escaping")
		}
	}
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/olivere/elastic/v7"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/faultproxy"
	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/internal/testkit/holdproxy"
	"github.com/wlproj/wlproj/projection"
)

// The deposed-leader-late-write scenario can fail: on the drill's path to
// the engine (a hold proxy, then the fault proxy), a bulk held past the
// engine's memory of a newer delete brings the book back unless its client
// reset the connection. wlproj's engine client (SO_LINGER 0), cancelled
// mid-bulk, has its bytes dropped; a plain net/http client, whose close is
// a FIN, has them delivered, and the book is back at v5.
func TestHeldBulkResurrectsUnlessItsConnectionWasReset(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		send  func(ctx context.Context, base, index, id string, doc map[string]any) error
		end   holdproxy.End
		found bool
	}{
		{"wlproj's client resets: dropped", sendWithWlproj, holdproxy.Reset, false},
		{"a plain client closes: delivered, resurrected", sendPlain, holdproxy.Closed, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			base := harness.ElasticURL(t)
			index := harness.NewIndex(t)
			engine, err := url.Parse(faultproxy.Start(t, base).URL())
			require.NoError(t, err)
			hold := holdproxy.Start(t, engine.Host)
			id := projection.DocumentID("book", lateBook)
			doc := book(lateBook, "v5", "lib-late", lateUpsert, "")

			hold.Hold()
			bctx, cancel := context.WithCancel(ctx)
			defer cancel()
			sent := make(chan error, 1)
			go func() { sent <- tc.send(bctx, "http://"+hold.Addr(), index, id, doc) }()
			quoted, _ := json.Marshal(id)
			require.Eventually(t, func() bool {
				h := hold.Held()
				return len(h) == 1 && bytes.Contains(h[0].Bytes, quoted)
			}, 10*time.Second, 10*time.Millisecond, "the bulk was never held")
			cancel()
			require.Error(t, <-sent)
			require.Eventually(t, func() bool {
				h := hold.Held()
				return len(h) == 1 && h[0].End == tc.end
			}, 5*time.Second, 10*time.Millisecond, "held: %v", hold.Held())

			// The new leader applies v5 and deletes the book at v6; then the
			// engine forgets the delete, as index.gc_deletes would.
			path := "/" + index + "/_doc/" + id
			raw, err := json.Marshal(doc)
			require.NoError(t, err)
			require.NoError(t, harness.ES(ctx, base, http.MethodPut, path+"?version=5&version_type=external_gte", raw, nil))
			require.NoError(t, harness.ES(ctx, base, http.MethodDelete, path+"?version=6&version_type=external_gte", nil, nil))
			harness.DeletesForgotten(t, index)

			rel := hold.Release()
			if !tc.found {
				require.Equal(t, 1, rel.Dropped, "%+v", rel)
				time.Sleep(lateArrival)
				found, version, err := docVersion(ctx, base, index, id)
				require.NoError(t, err)
				require.False(t, found, "resurrected at version %d", version)
				return
			}
			require.Equal(t, 1, rel.Delivered, "%+v", rel)
			require.Eventually(t, func() bool {
				found, version, err := docVersion(ctx, base, index, id)
				return err == nil && found && version == lateUpsert
			}, 10*time.Second, 50*time.Millisecond, "the delivered bulk did not bring the book back")
		})
	}
}

// sendWithWlproj sends the upsert as the consume loop does, with wlproj's
// engine client.
func sendWithWlproj(ctx context.Context, base, index, id string, doc map[string]any) error {
	c, err := projection.NewElasticClient(projection.ElasticOptions{URL: base})
	if err != nil {
		return err
	}
	_, err = c.Bulk().Index(index).
		Add(elastic.NewBulkIndexRequest().Id(id).Version(lateUpsert).VersionType("external_gte").Doc(doc)).
		Do(ctx)
	return err
}

// sendPlain sends the same bulk with net/http's defaults: a cancelled
// request closes its connection with a FIN.
func sendPlain(ctx context.Context, base, index, id string, doc map[string]any) error {
	action, err := json.Marshal(map[string]any{"index": map[string]any{
		"_index": index, "_id": id, "version": lateUpsert, "version_type": "external_gte"}})
	if err != nil {
		return err
	}
	source, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	body := string(action) + "\n" + string(source) + "\n"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/_bulk", strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/x-ndjson")
	client := &http.Client{Transport: &http.Transport{}}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

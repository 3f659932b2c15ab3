package consume

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
)

// TestBatchLogSaysWhereItsTimeWent: the batch's log line tells an operator
// chasing a lag whether its events were already old when read (the loop
// read late, or the producer committed late) or grew old after (the
// projection, the acks): an event written 3 s before the read, sent to a
// projection that takes 100 ms.
func TestBatchLogSaysWhereItsTimeWent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, created_at) VALUES ('book', 'b1', 'upsert', now() - interval '3 s')`)
	h := funcHandler(func(context.Context, outbox.Event) projection.Result {
		time.Sleep(100 * time.Millisecond)
		return projection.Result{}
	})
	var logs bytes.Buffer
	loop, err := NewLoop(Config{}, b.Store, projection.Registry{"search": h}, zerolog.New(&logs))
	require.NoError(t, err)
	res, err := loop.runOnce(context.Background(), 1)
	require.NoError(t, err)
	require.Equal(t, 1, res.Done)

	var line map[string]any
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, `"message":"batch"`) {
			require.NoError(t, json.Unmarshal([]byte(l), &line))
		}
	}
	require.NotNil(t, line, "a batch line:\n%s", logs.String())
	require.GreaterOrEqual(t, line["age_at_read_ms"], 3000.0, "the event was 3 s old when read")
	require.Less(t, line["age_at_read_ms"], 13000.0)
	require.GreaterOrEqual(t, line["duration_ms"], 100.0, "the projection's 100 ms")
	require.Greater(t, line["read_ms"], 0.0)
	require.GreaterOrEqual(t, line["waited_ms"], 0.0)
	require.Less(t, line["waited_ms"], line["duration_ms"], "nothing held the batch between its read and its processing")
}

package consume

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/wlproj/wlproj/classify"
	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/mask"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
)

// An event whose masked field holds a value the engine refuses (a string
// into a long) fails, and the value the engine's error quotes is in none
// of the row's error text, its history, the loop's logs or its spans;
// the engine's document of an event that succeeded holds its masked
// field's real value: masking never changes what is sent. Not parallel:
// it records the package's spans (recordSpans).
func TestMaskedValueIsInNoErrorTextLogOrSpan(t *testing.T) {
	const marker = "MARKER-c41d-not-a-number"
	b := setup(t)
	base, index := harness.ElasticURL(t), harness.NewIndexName(t)
	require.NoError(t, harness.ES(context.Background(), base, http.MethodPut, "/"+index,
		[]byte(`{"mappings":{"properties":{"contact":{"properties":{"phone":{"type":"long"},"email":{"type":"keyword"}}}}}}`), nil))
	client, err := projection.NewElasticClient(projection.ElasticOptions{URL: base})
	require.NoError(t, err)
	search, err := projection.NewSearch(projection.SearchConfig{Client: client, Index: index})
	require.NoError(t, err)
	m, err := mask.Compile([]string{"contact.*"})
	require.NoError(t, err)

	var logs bytes.Buffer
	spans := recordSpans(t)
	loop, err := NewLoop(Config{Masks: map[string]*mask.Mask{"search": m}}, b.Store, projection.Registry{"search": search},
		zerolog.New(&logs).Level(zerolog.DebugLevel))
	require.NoError(t, err)

	refused := fmt.Sprintf(`{"title": "refused", "contact": {"phone": %q}}`, marker)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload) VALUES
		('book', 'ok', 'upsert', 1, '{"title": "kept", "contact": {"email": "real@example.org", "phone": 5550100}}'),
		('book', 'bad', 'upsert', 1, $1)`, refused)

	// The control: unmasked, the engine's error quotes the value.
	unmasked := search.Handle(context.Background(), []outbox.Event{{ID: 1, Projection: "search", EntityType: "book",
		EntityID: "control", Op: outbox.OpUpsert, Payload: []byte(refused)}})
	require.Contains(t, classify.Classify(unmasked[0].Err).Message, marker, "the engine quotes the refused value")

	res, err := loop.runOnce(context.Background(), 1)
	require.NoError(t, err)
	require.Equal(t, 1, res.Done)
	require.Equal(t, 1, res.Failed)

	require.NotEmpty(t, spans.Ended(), "the batch was traced")
	var lastError, history string
	require.NoError(t, b.Pool.QueryRow(context.Background(), `SELECT last_error, error_history::text FROM outbox_events
		WHERE entity_id = 'bad' AND status = 'failed' AND error_reason = 'mapping_error'`).Scan(&lastError, &history))
	require.Contains(t, lastError, mask.Marker, "the quoted value, masked: %s", lastError)
	require.Contains(t, lastError, "contact.phone", "the rest of the engine's text is kept")
	for what, text := range map[string]string{"last_error": lastError, "error_history": history,
		"logs": logs.String(), "spans": spanText(spans.Ended())} {
		require.NotContains(t, text, marker, what)
		require.NotContains(t, text, "c41d", what)
	}
	require.Contains(t, logs.String(), `"message":"event failed"`, "the failure was logged")

	var doc struct {
		Source map[string]any `json:"_source"`
	}
	require.NoError(t, harness.ES(context.Background(), base, http.MethodGet, "/"+index+"/_doc/book:ok", nil, &doc))
	require.Equal(t, map[string]any{"email": "real@example.org", "phone": float64(5550100)}, doc.Source["contact"],
		"the engine holds the masked fields' real values")
}

// spanText is every span's name, attributes, events and status, as text.
func spanText(spans []sdktrace.ReadOnlySpan) string {
	var b bytes.Buffer
	for _, s := range spans {
		fmt.Fprintf(&b, "%s %v %v %v %v\n", s.Name(), s.Attributes(), s.Events(), s.Status(), s.Links())
	}
	return b.String()
}

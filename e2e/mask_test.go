package e2e

// Masked payloads through the real binary: a projection masks contact.*,
// and an event whose masked field holds a value the engine refuses (a
// string into a long) fails. Its value, which the engine's error quotes,
// is in nothing an operator or a collector sees; the engine's document of
// an event that succeeded holds the real value of its masked fields.

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// maskedProjection writes a projections file whose search projection
// (search, on its own index) maps contact.phone as a long and masks
// contact.*, beside the chronicle; it returns the file and the index.
func maskedProjection(t *testing.T, engineURL, index string) (file, alias string) {
	dir := t.TempDir()
	alias = index + "-masked"
	t.Cleanup(func() { _ = harness.DeleteIndex(context.Background(), engineURL, alias+"*") })
	mapping := `{"mappings": {"properties": {"title": {"type": "text"},
		"contact": {"properties": {"phone": {"type": "long"}, "email": {"type": "keyword"}}}}}}`
	require.NoError(t, os.WriteFile(filepath.Join(dir, "mapping.json"), []byte(mapping), 0o600))
	file = filepath.Join(dir, "projections.yaml")
	require.NoError(t, os.WriteFile(file, []byte(fmt.Sprintf(`
projections:
  search:
    kind: search
    engine: {urls: [%s]}
    index: %s
    mapping_file: %s/mapping.json
    mask: ["contact.*"]
  chronicle:
    kind: chronicle
`, engineURL, alias, dir)), 0o600))
	return file, alias
}

func TestMaskedValueShowsNowhere(t *testing.T) {
	t.Parallel()
	const marker = "MARKER-e2e-9d1c"
	recv, endpoint := startHTTPReceiver(t)
	const user, password = "ada", "console-pw"
	c := newCluster(t, "OTEL_EXPORTER_OTLP_ENDPOINT="+endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_BSP_SCHEDULE_DELAY=100", "OUTBOX_CONSOLE_USERS_FILE="+consoleUsers(t, user, password))
	file, alias := maskedProjection(t, harness.ElasticURL(t), c.index)
	c.env = append(c.env, "OUTBOX_PROJECTIONS_FILE="+file)
	r := c.run("a")

	c.db.Exec(t, `INSERT INTO outbox_events (projection, entity_type, entity_id, op, event_version, payload) VALUES
		('search', 'book', 'ok', 'upsert', 1, '{"title": "kept", "contact": {"email": "real@example.org", "phone": 5550100}}'),
		('search', 'book', 'bad', 'upsert', 1, jsonb_build_object('title', 'refused', 'contact', jsonb_build_object('phone', $1::text)))`, marker)
	harness.Eventually(t, 30*time.Second, "book:bad failed as a mapping error, book:ok done", func() bool {
		return c.count(`entity_id = 'bad' AND status = 'failed' AND error_reason = 'mapping_error'`) == 1 &&
			c.count(`entity_id = 'ok' AND status = 'done'`) == 1
	})
	bad := int64(c.db.Int(t, `SELECT id FROM outbox_events WHERE entity_id = 'bad'`))
	var lastError string
	require.NoError(t, c.db.Pool.QueryRow(context.Background(), `SELECT last_error || ' ' || error_history::text
		FROM outbox_events WHERE id = $1`, bad).Scan(&lastError))
	require.Contains(t, lastError, "Preview of field's value: '***'", "the engine quoted the value; it is masked")

	var doc struct {
		Source map[string]any `json:"_source"`
	}
	require.NoError(t, harness.ES(context.Background(), harness.ElasticURL(t), http.MethodGet, "/"+alias+"/_doc/book:ok", nil, &doc))
	require.Equal(t, map[string]any{"email": "real@example.org", "phone": float64(5550100)}, doc.Source["contact"],
		"masking never changes what is sent")

	var seen output
	seen.add("last_error and error_history", lastError)
	id := strconv.FormatInt(bad, 10)
	page := consoleSession(t, r, user, password)
	seen.add("console event page", page("events/"+id))
	seen.add("console failed page", page("failed"))
	seen.add("wlproj failed list", c.cli("failed", "list"))
	seen.add("wlproj failed list --json", c.cli("failed", "list", "--json"))
	seen.add("wlproj doc", c.cli("doc", "book:bad", "--projections-file", file))
	seen.add("wlproj doc --json", c.cli("doc", "book:bad", "--json", "--projections-file", file))
	seen.add("wlproj event", c.cli("event", id, "--projections-file", file))
	seen.add("wlproj event --json", c.cli("event", id, "--json", "--projections-file", file))
	c.db.Exec(t, `UPDATE outbox_events SET updated_at = now() - interval '1 hour' WHERE id = $1`, bad) // failed long ago
	c.cli("failed", "archive", "--ids", id, "--older-than", "1m", "--by", "ada", "--why", "closed")
	seen.add("console archived page", page("archived"))
	seen.add("console archived event page", page("events/"+id))
	seen.add("wlproj failed list --archived", c.cli("failed", "list", "--archived"))
	seen.add("wlproj failed list --archived --json", c.cli("failed", "list", "--archived", "--json"))

	harness.Eventually(t, 20*time.Second, "the failed batch's spans exported", func() bool {
		for _, s := range recv.received() {
			if s.span.GetName() == "wlproj.batch" && strings.Contains(s.span.String(), "wlproj.failed") {
				for _, kv := range s.span.GetAttributes() {
					if kv.GetKey() == "wlproj.failed" && kv.GetValue().GetIntValue() == 1 {
						return true
					}
				}
			}
		}
		return false
	})
	var spans strings.Builder
	for _, s := range recv.received() {
		spans.WriteString(s.span.String() + "\n")
	}
	seen.add("exported spans", spans.String())
	r.Stop(10 * time.Second)
	require.True(t, hasLogLine(r.Logs(), "warn", func(logLine) bool { return true }), "the failure was logged")
	seen.add("logs", r.Logs())

	for _, s := range seen.all() {
		require.NotContains(t, s.text, marker, s.what)
		require.NotContains(t, s.text, "9d1c", s.what)
	}
	require.Contains(t, seen.all()[1].text, "***", "the event page shows the masked field")
}

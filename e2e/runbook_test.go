package e2e

// runbook.md promises that its commands work as written. The blocks it marks
// as runnable (```sh runnable, ```sql runnable) run here, in document order,
// against a database and index of the test's own with two live replicas,
// exactly as an operator would paste them: sh blocks with bash -euo pipefail
// from the repository root, SQL blocks with psql. The environment holds only
// the variables the runbook documents.

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

const (
	rbFile = "runbook.md"
	// rbMarker is the info-string word that makes a block runnable.
	rbMarker = "runnable"
	// The least the runbook must hold, so the check cannot pass vacuously
	// because a marker was lost in an edit.
	rbMinSh  = 12
	rbMinSQL = 10
	// rbBlockTimeout bounds one block; every runbook command is quick.
	rbBlockTimeout = 60 * time.Second
)

// rbBlock is one fenced code block of the runbook.
type rbBlock struct {
	lang     string // first word of the info string: sh, sql, ...
	runnable bool
	line     int // line of the opening fence, 1-based
	body     string
}

var rbFence = regexp.MustCompile("^\\s*(`{3,})\\s*([^`]*)$")

// rbParse returns the fenced blocks of a Markdown text. It fails on a block
// that is never closed and on an unknown word in an info string, so a typo
// such as "sh runable" cannot silently drop a block from the check.
func rbParse(t *testing.T, text string) []rbBlock {
	t.Helper()
	var blocks []rbBlock
	var cur *rbBlock
	var fence string
	var body strings.Builder
	sc := bufio.NewScanner(strings.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		m := rbFence.FindStringSubmatch(line)
		if cur != nil {
			if m != nil && len(m[1]) >= len(fence) && strings.TrimSpace(m[2]) == "" {
				cur.body = body.String()
				blocks = append(blocks, *cur)
				cur = nil
				continue
			}
			body.WriteString(line + "\n")
			continue
		}
		if m == nil {
			continue
		}
		words := strings.Fields(m[2])
		cur = &rbBlock{line: n}
		fence = m[1]
		body.Reset()
		if len(words) > 0 {
			cur.lang = words[0]
		}
		for _, w := range words[min(1, len(words)):] {
			require.Equal(t, rbMarker, w, "%s:%d: unknown word %q in the info string %q", rbFile, n, w, m[2])
			cur.runnable = true
		}
	}
	require.NoError(t, sc.Err())
	if cur != nil {
		t.Fatalf("%s: the block opened at line %d is never closed", rbFile, cur.line)
	}
	return blocks
}

func rbRead(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(harness.Root(t), rbFile))
	require.NoError(t, err)
	return string(b)
}

func TestRunbookParse(t *testing.T) {
	t.Parallel()
	blocks := rbParse(t, "text\n```sh runnable\necho a\n```\n\n````md\n```sql runnable\nnot a block\n```\n````\n```sql\nSELECT 1;\n```\n")
	require.Equal(t, []rbBlock{
		{lang: "sh", runnable: true, line: 2, body: "echo a\n"},
		{lang: "md", line: 6, body: "```sql runnable\nnot a block\n```\n"},
		{lang: "sql", line: 11, body: "SELECT 1;\n"},
	}, blocks)
}

// rbTool finds an executable the runbook's commands need; missing it is a
// failure, not a skip, so the check cannot pass by not running.
func rbTool(t *testing.T, name string, dirs ...string) string {
	t.Helper()
	for _, d := range dirs {
		if d == "" {
			continue
		}
		if p := filepath.Join(d, name); rbIsExec(p) {
			return p
		}
	}
	p, err := exec.LookPath(name)
	require.NoError(t, err, "%s is needed to run the runbook's commands (scripts/tools.sh installs it)", name)
	return p
}

func rbIsExec(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// rbSeed writes the demo workload in small: books with several versions,
// their chronicle events, and the demo's bad events
// (testdata/demo_workload.sql, round 1), which end failed with
// mapping_error, payload_invalid and unknown_projection.
const rbSeed = `
INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload, scope_key)
SELECT 'book', 'lib' || (e % 3 + 1) || '-book' || e, 'upsert', v,
       jsonb_build_object('kind', 'book', 'title', 'Book ' || e || ' draft ' || v,
                          'library_id', 'lib' || (e % 3 + 1), 'word_count', 1000 * v),
       'lib' || (e % 3 + 1)
  FROM generate_series(1, 30) e, generate_series(1, 3) v
 ORDER BY random();
INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload, scope_key) VALUES
  ('book', 'bad-strict-1', 'upsert', 1, '{"kind": "book", "title": "x", "colour": "red"}', 'lib2'),
  ('block', 'bad-type-1', 'upsert', 1, '{"kind": "block", "position": "third"}', 'lib2'),
  ('block', 'bad-array-1', 'upsert', 1, '["not", "an", "object"]', 'lib3');
INSERT INTO outbox_events (projection, entity_type, entity_id, op, event_version, payload, scope_key) VALUES
  ('wordcount', 'book', 'lib1-book1', 'upsert', 1, '{"words": 1200}', 'lib1');
INSERT INTO outbox_events (projection, entity_type, entity_id, op, event_version, payload, scope_key)
SELECT 'chronicle', 'book', 'lib1-book' || e, 'upsert', v, jsonb_build_object('event', 'edited', 'draft', v), 'lib1'
  FROM generate_series(1, 3) e, generate_series(1, 3) v;`

func TestRunbookCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	runnable := rbRunnable(t)
	st := rbSetup(t)
	scripts := t.TempDir()
	for i, b := range runnable {
		t.Run(fmt.Sprintf("%s_line%d", b.lang, b.line), func(t *testing.T) {
			file := filepath.Join(scripts, fmt.Sprintf("%02d.%s", i, b.lang))
			require.NoError(t, os.WriteFile(file, []byte(b.body), 0o600))
			bctx, cancel := context.WithTimeout(ctx, rbBlockTimeout)
			defer cancel()
			var cmd *exec.Cmd
			if b.lang == "sh" {
				cmd = exec.CommandContext(bctx, "bash", "--noprofile", "--norc", "-euo", "pipefail", file)
			} else {
				cmd = exec.CommandContext(bctx, st.psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", file, st.db.URL)
			}
			cmd.Dir = harness.Root(t)
			cmd.Env = st.env
			cmd.WaitDelay = 5 * time.Second
			out, err := cmd.CombinedOutput()
			t.Logf("%s:%d:\n%s\n--- output:\n%s", rbFile, b.line, b.body, out)
			require.NoError(t, err, "%s block at %s:%d failed:\n%s\n--- output:\n%s", b.lang, rbFile, b.line, b.body, out)
		})
	}

	// The replay procedure did what it says: fixed mapping, audited replay,
	// the failed document indexed.
	db := st.db
	var by, why string
	require.NoError(t, db.Pool.QueryRow(ctx,
		`SELECT replayed_by, reason FROM outbox_replay_audit WHERE selector->'given'->>'reason' = 'mapping_error' ORDER BY id LIMIT 1`).
		Scan(&by, &why))
	require.NotEmpty(t, by)
	require.Contains(t, why, "colour")
	harness.Eventually(t, 15*time.Second, "book:bad-strict-1 indexed after the replay", func() bool {
		return db.Count(t, `entity_id = 'bad-strict-1' AND status = 'done' AND replay_count = 1`) == 1
	})
	var doc struct {
		Found  bool           `json:"found"`
		Source map[string]any `json:"_source"`
	}
	require.NoError(t, harness.ES(ctx, harness.ElasticURL(t), http.MethodGet, "/"+st.index+"/_doc/book:bad-strict-1", nil, &doc))
	require.True(t, doc.Found)
	require.Equal(t, "red", doc.Source["colour"])

	// The dry runs changed nothing: only the mapping_error rows were replayed.
	require.Equal(t, 0, db.Count(t, `entity_id = 'bad-array-1' AND replay_count > 0`), "a dry run replayed")
	// The least-privilege section ran: the outbox belongs to the owner role.
	var tableOwner string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = 'outbox_events'::regclass`).Scan(&tableOwner))
	require.Equal(t, st.owner, tableOwner)
}

// rbRunnable is the runbook's runnable blocks; there must be enough of them.
func rbRunnable(t *testing.T) []rbBlock {
	t.Helper()
	var runnable []rbBlock
	count := map[string]int{}
	for _, b := range rbParse(t, rbRead(t)) {
		if !b.runnable {
			continue
		}
		require.Contains(t, []string{"sh", "sql"}, b.lang, "%s:%d: only sh and sql blocks can be runnable", rbFile, b.line)
		runnable = append(runnable, b)
		count[b.lang]++
	}
	require.GreaterOrEqual(t, count["sh"], rbMinSh, "runnable sh blocks in %s", rbFile)
	require.GreaterOrEqual(t, count["sql"], rbMinSQL, "runnable sql blocks in %s", rbFile)
	return runnable
}

// rbStack is what the runbook's blocks run against.
type rbStack struct {
	db    harness.DB
	index string
	owner string
	psql  string
	env   []string
}

// rbSetup seeds a database and index of the test's own, drained by two
// replicas, and returns the environment the runbook documents, and nothing
// else of the test's.
func rbSetup(t *testing.T) rbStack {
	t.Helper()
	psql := rbTool(t, "psql", harness.StackEnv(t)["STACK_PG_BINDIR"], "/usr/lib/postgresql/15/bin")
	rbTool(t, "jq")
	rbTool(t, "curl")
	// Roles before the database, so they are dropped after it.
	owner, runtime := harness.Roles(t, "rb")
	st := rbStack{db: harness.NewDatabase(t), index: harness.NewIndex(t), owner: owner, psql: psql}
	db := st.db
	db.Exec(t, rbSeed)

	// Two replicas, as in production: the runbook's port is the leader's.
	env := harness.ReplicaEnv(db.URL, harness.ElasticURL(t), st.index, harness.Quick...)
	a, b := harness.StartReplica(t, "rb-a", env), harness.StartReplica(t, "rb-b", env)
	harness.Healthy(t, a, b)
	leader := harness.Leader(t, a, b)
	harness.Eventually(t, 30*time.Second, "the seeded events settle, four of them failed", func() bool {
		return db.Count(t, `status IN ('pending', 'processing')`) == 0 && db.Count(t, `status = 'failed'`) == 4
	})

	bin := t.TempDir()
	require.NoError(t, os.Symlink(harness.Binary(t), filepath.Join(bin, "wlproj")))
	u, err := url.Parse(db.URL)
	require.NoError(t, err)
	st.env = []string{
		"PATH=" + strings.Join([]string{bin, filepath.Dir(psql), os.Getenv("PATH")}, string(os.PathListSeparator)),
		"HOME=" + t.TempDir(),
		"LANG=C.UTF-8",
		"DATABASE_URL=" + db.URL,
		"ELASTIC_URL=" + harness.ElasticURL(t),
		"ELASTIC_INDEX=" + st.index,
		"OUTBOX_HTTP_PORT=" + strconv.Itoa(leader.HTTPPort),
		"ADMIN_DATABASE_URL=" + db.URL,
		"DB_NAME=" + db.Name,
		"DB_HOST=" + u.Hostname(),
		"DB_PORT=" + u.Port(),
		"OWNER_ROLE=" + owner,
		"RUNTIME_ROLE=" + runtime,
		"OWNER_PW=owner-pw",
		"RUNTIME_PW=runtime-pw",
		"OWNER_DATABASE_URL=" + db.Login(t, owner, "owner-pw"),
		"RUNTIME_DATABASE_URL=" + db.Login(t, runtime, "runtime-pw"),
	}
	return st
}

var (
	rbHelpEnv     = regexp.MustCompile(`\(\$([A-Z][A-Z0-9_]*)\)`)
	rbTableVar    = regexp.MustCompile("(?m)^\\| `([A-Z][A-Z0-9_]*)` \\|")
	rbHeading     = regexp.MustCompile(`(?m)^#{1,6}\s+(.+?)\s*#*\s*$`)
	rbExplicitID  = regexp.MustCompile(`<a id="([^"]+)"></a>`)
	rbLocalLink   = regexp.MustCompile(`\]\(#([^)]+)\)`)
	rbSlugDropped = regexp.MustCompile(`[^\p{L}\p{N} _-]`)
)

// Every environment variable any wlproj command reads has a row in the
// runbook's tables, so the configuration table cannot fall behind the code.
func TestRunbookConfigTableComplete(t *testing.T) {
	t.Parallel()
	text := rbRead(t)
	rows := map[string]bool{}
	for _, m := range rbTableVar.FindAllStringSubmatch(text, -1) {
		rows[m[1]] = true
	}
	var missing []string
	for _, args := range [][]string{{"--help"}, {"run", "--help"}, {"migrate", "--help"}, {"status", "--help"},
		{"failed", "list", "--help"}, {"failed", "stats", "--help"}, {"replay", "--help"}} {
		cmd := exec.Command(harness.Binary(t), args...)
		cmd.Env = append(os.Environ(), "COLUMNS=300")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		for _, m := range rbHelpEnv.FindAllStringSubmatch(string(out), -1) {
			if !rows[m[1]] {
				missing = append(missing, fmt.Sprintf("%s (wlproj %s)", m[1], strings.Join(args, " ")))
			}
		}
	}
	require.Empty(t, missing, "env vars with no row in %s's configuration table", rbFile)
}

// Every #anchor the runbook links to exists, computed as GitHub does (the same
// rule as deploy/deploy_test.go, which checks the alerts' links).
func TestRunbookLocalLinks(t *testing.T) {
	t.Parallel()
	text := rbRead(t)
	// Headings inside code blocks are not headings.
	var prose strings.Builder
	in := false
	for _, line := range strings.Split(text, "\n") {
		if rbFence.MatchString(line) {
			in = !in
			continue
		}
		if !in {
			prose.WriteString(line + "\n")
		}
	}
	have := map[string]bool{}
	for _, m := range rbHeading.FindAllStringSubmatch(prose.String(), -1) {
		s := strings.ToLower(strings.TrimSpace(m[1]))
		s = rbSlugDropped.ReplaceAllString(s, "")
		have[strings.ReplaceAll(s, " ", "-")] = true
	}
	for _, m := range rbExplicitID.FindAllStringSubmatch(text, -1) {
		have[m[1]] = true
	}
	for _, m := range rbLocalLink.FindAllStringSubmatch(prose.String(), -1) {
		require.True(t, have[m[1]], "%s links to #%s, which has no heading or anchor", rbFile, m[1])
	}
	for _, a := range []string{"sop-backlog", "sop-stuck-rows", "sop-terminal-failures", "sop-no-leader",
		"sop-split-brain", "sop-leader-flapping", "sop-replica-not-ready"} {
		require.True(t, have[a], "the alerts link to %s#%s", rbFile, a)
	}
}

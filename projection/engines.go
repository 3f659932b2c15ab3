package projection

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/olivere/elastic/v7"
	"github.com/rs/zerolog"

	"github.com/wlproj/wlproj/classify"
)

// TestedEngines are the engines `make test` runs against, one per major
// line, with the version it runs: the whole suite on the first, the
// engine-facing tests on the others. scripts/stack.sh starts the same
// versions (a test keeps the two equal) and README.md lists them. The
// daemon warns at start when its engine is of another line.
var TestedEngines = []TestedEngine{
	{Line: "elasticsearch-7", Version: "7.17.29"},
	{Line: "elasticsearch-8", Version: "8.19.21"},
	{Line: "opensearch-2", Version: "2.19.6"},
	{Line: "opensearch-3", Version: "3.6.0"},
}

// TestedEngine is one line of TestedEngines.
type TestedEngine struct {
	// Line is the distribution and major version, as Engine.Line.
	Line string
	// Version is the version the tests run.
	Version string
}

// Engine is a search engine as it describes itself.
type Engine struct {
	// Distribution is "elasticsearch" or "opensearch".
	Distribution string
	// Version is its version number, e.g. "8.19.21".
	Version string
}

func (e Engine) String() string { return e.Distribution + " " + e.Version }

// Line is the engine's distribution and major version, as scripts/stack.sh
// and testdata/ name them: "elasticsearch-8", "opensearch-2".
func (e Engine) Line() string {
	major, _, _ := strings.Cut(e.Version, ".")
	return e.Distribution + "-" + major
}

// Tested returns the tested line the engine belongs to, if any.
func (e Engine) Tested() (TestedEngine, bool) {
	for _, t := range TestedEngines {
		if t.Line == e.Line() {
			return t, true
		}
	}
	return TestedEngine{}, false
}

// Identify asks the engine what it is: GET /, or where the root endpoint is
// missing the local node's info. Elasticsearch 8's integ-test distribution
// lacks the rest-root module that serves GET /; there the product comes from
// the X-Elastic-Product header that Elasticsearch sends since 7.14.
func Identify(ctx context.Context, client *elastic.Client) (Engine, error) {
	resp, err := client.PerformRequest(ctx, elastic.PerformRequestOptions{Method: http.MethodGet, Path: "/"})
	if err == nil {
		var root struct {
			Version struct {
				Number       string `json:"number"`
				Distribution string `json:"distribution"`
			} `json:"version"`
		}
		if err := json.Unmarshal(resp.Body, &root); err != nil || root.Version.Number == "" {
			return Engine{}, classify.New(classify.Unknown, "GET / answered without a version number")
		}
		return Engine{Distribution: cmp.Or(root.Version.Distribution, "elasticsearch"), Version: root.Version.Number}, nil
	}
	if !elastic.IsStatusCode(err, http.StatusMethodNotAllowed) && !elastic.IsNotFound(err) {
		return Engine{}, err
	}
	resp, err = client.PerformRequest(ctx, elastic.PerformRequestOptions{Method: http.MethodGet, Path: "/_nodes/_local",
		Params: url.Values{"filter_path": {"nodes.*.version"}}})
	if err != nil {
		return Engine{}, err
	}
	var info struct {
		Nodes map[string]struct {
			Version string `json:"version"`
		} `json:"nodes"`
	}
	e := Engine{Distribution: "unknown"}
	if resp.Header.Get("X-Elastic-Product") == "Elasticsearch" {
		e.Distribution = "elasticsearch"
	}
	if err := json.Unmarshal(resp.Body, &info); err == nil {
		for _, n := range info.Nodes {
			e.Version = n.Version
		}
	}
	if e.Version == "" {
		return Engine{}, classify.New(classify.Unknown, "neither GET / nor the node info gave a version number")
	}
	return e, nil
}

const (
	announceBackoffMin = time.Second
	announceBackoffMax = 30 * time.Second
)

// EngineProbe knows which engine a client talks to, once it has answered,
// and checks that it answers.
type EngineProbe struct {
	client *elastic.Client
	url    string // every node, for messages
	first  string // the first node, for commands to paste
	nodes  int
	engine atomic.Pointer[Engine]
}

// NewEngineProbe probes the engine of client, which rawURL (the client's
// URL or node list; any user info is dropped) names in messages.
func NewEngineProbe(client *elastic.Client, rawURL string) *EngineProbe {
	p := &EngineProbe{client: client, url: RedactedURLs(rawURL), nodes: 1}
	p.first, _, _ = strings.Cut(p.url, ",")
	if nodes, _, _, err := ParseNodes(rawURL); err == nil {
		p.nodes = len(nodes)
	}
	return p
}

// Engine returns the engine, once Announce has identified it.
func (p *EngineProbe) Engine() (Engine, bool) {
	if e := p.engine.Load(); e != nil {
		return *e, true
	}
	return Engine{}, false
}

// name is the engine and its URL, or the URL alone until it is known.
func (p *EngineProbe) name() string {
	if e, ok := p.Engine(); ok {
		return e.String() + " at " + p.url
	}
	return p.url
}

// Ping checks that the engine answers its cluster health with the
// credentials. The error names the engine, and classify.Classify finds its
// reason: auth_error for refused credentials, tls_error for a certificate
// not trusted, connection, timeout, server_error. Of several nodes, one
// answering is enough: a request that got no answer is tried on the next
// node, so that a lost node does not fail readiness each time the client
// tries it again.
func (p *EngineProbe) Ping(ctx context.Context) error {
	var err error
	for range p.nodes {
		if _, err = p.client.ClusterHealth().Do(ctx); err == nil {
			return nil
		}
		if ce := classify.Classify(err); ce.Status != 0 || ctx.Err() != nil {
			break
		}
	}
	return fmt.Errorf("%s: %w", p.name(), classify.Classify(err))
}

// Announce identifies the engine and logs its name and version once, with a
// warning when it is of no tested line. Until the engine answers it logs why
// not, once per reason, and tries again with backoff. It returns once it has
// logged the engine, or when ctx ends.
func (p *EngineProbe) Announce(ctx context.Context, log zerolog.Logger) {
	wait, lastReason := announceBackoffMin, ""
	for {
		e, err := Identify(ctx, p.client)
		if err == nil {
			p.engine.Store(&e)
			p.logEngine(e, log)
			return
		}
		if ctx.Err() != nil {
			return
		}
		if ce := classify.Classify(err); ce.Reason != lastReason {
			lastReason = ce.Reason
			ev := log.Warn()
			switch ce.Reason {
			case classify.AuthError, classify.TLSError:
				ev = log.Error()
			}
			ev.Str("url", p.url).Str("reason", ce.Reason).Str("error", ce.Message).
				Msg(cmp.Or(announceText[ce.Reason], "the engine does not answer") + "; its name is logged once it answers")
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, announceBackoffMax)
	}
}

var announceText = map[string]string{
	classify.AuthError: "the engine refused the credentials",
	classify.TLSError:  "TLS with the engine failed",
}

func (p *EngineProbe) logEngine(e Engine, log zerolog.Logger) {
	tested, ok := e.Tested()
	if ok {
		log.Info().Str("engine", e.Distribution).Str("version", e.Version).Str("url", p.url).
			Str("tested_version", tested.Version).Msg("engine")
		return
	}
	names := make([]string, len(TestedEngines))
	for i, t := range TestedEngines {
		names[i] = t.Line + " (" + t.Version + ")"
	}
	log.Warn().Str("engine", e.Distribution).Str("version", e.Version).Str("url", p.url).
		Msg("untested engine: wlproj is tested with " + strings.Join(names, ", "))
}

// GCDeletes is one concrete index's index.gc_deletes: how long the engine
// remembers a delete's version. A write that reaches the engine later than
// that after a delete of its document, with an older version, brings the
// document back.
type GCDeletes struct {
	// Index is the concrete index; the name checked may be an alias.
	Index string
	// Setting is the value as the engine reports it, e.g. "60s".
	Setting string
	// Value is Setting as a duration.
	Value time.Duration
	// Short is Value under the write lifetime checked against.
	Short bool
	// Command raises the setting to the write lifetime, rounded up to a
	// minute, when Short.
	Command string
}

// gcDeletesDefault is the engine's default index.gc_deletes.
const gcDeletesDefault = "60s"

// CheckGCDeletes reads index.gc_deletes of every concrete index behind
// index (an index or an alias) and compares it with lifetime, the
// WriteLifetime of the client's bulks. An index that does not exist yet
// gives none.
func (p *EngineProbe) CheckGCDeletes(ctx context.Context, index string, lifetime time.Duration) ([]GCDeletes, error) {
	resp, err := p.client.PerformRequest(ctx, elastic.PerformRequestOptions{Method: http.MethodGet,
		Path: "/" + url.PathEscape(index) + "/_settings",
		Params: url.Values{"include_defaults": {"true"},
			"filter_path": {"*.settings.index.gc_deletes,*.defaults.index.gc_deletes"}}})
	if elastic.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s: reading index.gc_deletes of %s: %w", p.name(), index, classify.Classify(err))
	}
	type gc struct {
		Index struct {
			GCDeletes string `json:"gc_deletes"`
		} `json:"index"`
	}
	var settings map[string]struct {
		Settings gc `json:"settings"`
		Defaults gc `json:"defaults"`
	}
	if err := json.Unmarshal(resp.Body, &settings); err != nil {
		return nil, fmt.Errorf("%s: reading index.gc_deletes of %s: %w", p.name(), index, err)
	}
	raise := lifetime.Truncate(time.Minute)
	if raise < lifetime {
		raise += time.Minute
	}
	var out []GCDeletes
	for _, name := range slices.Sorted(maps.Keys(settings)) {
		s := settings[name]
		g := GCDeletes{Index: name, Setting: cmp.Or(s.Settings.Index.GCDeletes, s.Defaults.Index.GCDeletes, gcDeletesDefault)}
		if g.Value, err = parseTimeValue(g.Setting); err != nil {
			return nil, fmt.Errorf("%s: index.gc_deletes of %s: %w", p.name(), name, err)
		}
		if g.Short = g.Value < lifetime; g.Short {
			g.Command = fmt.Sprintf(`curl -XPUT '%s/%s/_settings' -H 'Content-Type: application/json' -d '{"index.gc_deletes":"%dm"}'`,
				strings.TrimRight(p.first, "/"), name, raise/time.Minute)
		}
		out = append(out, g)
	}
	return out, nil
}

// WarnGCDeletes logs a warning, with the command that fixes it, for each
// concrete index behind index whose index.gc_deletes is shorter than
// lifetime, and one when the setting cannot be read.
func (p *EngineProbe) WarnGCDeletes(ctx context.Context, log zerolog.Logger, index string, lifetime time.Duration) {
	found, err := p.CheckGCDeletes(ctx, index, lifetime)
	if err != nil {
		if ctx.Err() == nil {
			log.Warn().Err(err).Str("index", index).Msg("could not check index.gc_deletes against the write lifetime")
		}
		return
	}
	for _, g := range found {
		if g.Short {
			log.Warn().Str("index", g.Index).Str("gc_deletes", g.Setting).Str("write_lifetime", lifetime.String()).
				Str("command", g.Command).
				Msg("index.gc_deletes is shorter than the write lifetime: a late write could bring a deleted document back; raise it (runbook: Write lifetime)")
		}
	}
}

// parseTimeValue reads the engine's time values: "60s", "500ms", "1m",
// "1d", "100micros", "-1". A negative one prunes deletes at once, as zero.
func parseTimeValue(v string) (time.Duration, error) {
	v = strings.TrimSpace(v)
	if v == "-1" {
		return 0, nil
	}
	units := []struct {
		suffix string
		unit   time.Duration
	}{{"nanos", time.Nanosecond}, {"micros", time.Microsecond}, {"ms", time.Millisecond},
		{"s", time.Second}, {"m", time.Minute}, {"h", time.Hour}, {"d", 24 * time.Hour}}
	for _, u := range units {
		if num, ok := strings.CutSuffix(v, u.suffix); ok {
			n, err := strconv.ParseFloat(num, 64)
			if err != nil {
				break
			}
			return max(time.Duration(n*float64(u.unit)), 0), nil
		}
	}
	return 0, fmt.Errorf("time value %q not understood", v)
}

package projection

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/olivere/elastic/v7"

	"github.com/wlproj/wlproj/classify"
	"github.com/wlproj/wlproj/internal/bounds"
)

const (
	// idleConnsPerHost keeps connections open for every bulk the loop may
	// have in flight; net/http's default of 2 would reconnect constantly.
	idleConnsPerHost = 32
	// dialTimeout bounds setting up a connection, TCP and TLS handshakes
	// each: a lost host (no RST) costs a request that long, not its whole
	// deadline, before the next node of a list is tried. Long enough for
	// two retransmitted SYNs (at 1 s and 3 s).
	dialTimeout = 5 * time.Second
	// keepAlive is net/http's DefaultTransport's.
	keepAlive = 30 * time.Second
)

// TCPUserTimeout is how long data sent to the engine may stay
// unacknowledged before the kernel drops the connection (TCP_USER_TIMEOUT).
// Without it Linux retransmits for ~15 minutes (tcp_retries2), so a bulk
// held in the network, or left by a frozen leader, could reach the engine
// after it forgot a delete's version and bring the document back.
const TCPUserTimeout = 10 * time.Second

// bulkTimeouts are a bulk's deadline on the client and the `timeout` the
// engine gets with it, for requests that time out after timeout. The
// engine's is the shorter, so that a bulk waiting for a shard is answered
// (503 per item, retried) before the client gives up on it.
func bulkTimeouts(timeout time.Duration) (client, server time.Duration) {
	return timeout, max(timeout/3, time.Millisecond)
}

// WriteLifetime is the longest a write wlproj sends can still change the
// index after its bulk started, for ElasticOptions.Timeout timeout (0 is
// TimeoutDefault): the bulk's bytes leave the client before its deadline or
// never (the connection closes abortively and the kernel discards them),
// bytes already sent arrive within TCPUserTimeout or the kernel gives up,
// and the engine waits for a shard at most the bulk's server-side timeout
// before applying. A bulk that a node list's picker sends again to another
// node (nodePicker) does not extend it: every attempt runs under the one
// deadline, and the attempt it abandons closes abortively like any other.
// The index's index.gc_deletes must be at least this long, or a late
// upsert can overwrite a delete the engine has forgotten.
// Defaults: 30s + 10s + 10s = 50s, under the engine's 60s.
func WriteLifetime(timeout time.Duration) time.Duration {
	client, server := bulkTimeouts(cmp.Or(timeout, TimeoutDefault))
	return client + TCPUserTimeout + server
}

// clientTimeouts holds each client's ElasticOptions.Timeout for the bulks
// sent with it: a Search is built from the client, not from its options.
var clientTimeouts sync.Map // *elastic.Client → time.Duration

// timeoutOf is the Timeout c was built with, TimeoutDefault for a client
// not built by NewElasticClient.
func timeoutOf(c *elastic.Client) time.Duration {
	if d, ok := clientTimeouts.Load(c); ok {
		return d.(time.Duration)
	}
	return TimeoutDefault
}

// The bulk requests the engine is sent, by the leader's loop and by the
// rebuild: documents per request and requests in flight at once. Their
// defaults and ranges are those of consume.Config and rebuild.Config, and of
// the CLI's flags.
const (
	BulkSizeDefault    = 500
	ConcurrencyDefault = 2
)

var (
	BulkSizeRange    = bounds.Range[int]{Min: 1, Max: 10000}
	ConcurrencyRange = bounds.Range[int]{Min: 1, Max: 64}
)

// TimeoutDefault is ElasticOptions.Timeout's default; the CLI's flag takes
// it from here, and TimeoutRange is what it accepts.
const TimeoutDefault = 30 * time.Second

var TimeoutRange = bounds.Range[time.Duration]{Min: 100 * time.Millisecond, Max: 10 * time.Minute}

// ElasticOptions configure the client for the search engine.
type ElasticOptions struct {
	// URL is the engine's base URL, or several nodes' base URLs separated
	// by commas, over which requests are spread (see NewElasticClient). User
	// info in any of them is used for basic auth with every node and removed
	// from the URLs, so that it never shows up in error messages. Required.
	URL string
	// Username for basic auth. Defaults to the user in URL, if any.
	Username string
	// Password for basic auth. Defaults to the password in URL, if any.
	Password string
	// APIKey is an Elasticsearch API key, the id:key pair or its base64
	// form (the create-API-key answer's "encoded"), sent as
	// "Authorization: ApiKey <base64(id:key)>" on every request. It
	// excludes basic auth. Defaults to none.
	APIKey string
	// CAFile is a PEM file of the CAs to trust for https. Defaults to the
	// system's trust store.
	CAFile string
	// Timeout bounds each HTTP request. Defaults to 30s.
	Timeout time.Duration
}

// NewElasticClient builds a client for the engine endpoint, or the nodes,
// that o.URL lists: no health checks and no retries of its own, because the
// consume loop retries with backoff and records each attempt. It makes no
// request.
//
// Several URLs are spread over by the client's transport (nodePicker), not
// by olivere: olivere's own round robin, without its health checks, never
// sends to a node it once marked dead until every node is, and its health
// check (HEAD /) fails on Elasticsearch 8's integ-test distribution and with
// credentials that may not read the root endpoint. Sniffing stays off:
// nodes publish the addresses they bind, which the client often cannot
// reach (containers, NAT, a load balancer in front), and the list the
// operator gives is the contract.
//
// The same client serves every engine of TestedEngines. What wlproj sends
// (typeless bulk requests with external_gte versions, cluster health, GET /)
// is 7.x's API, which Elasticsearch 8 answers as it is, so no REST
// compatibility headers (compatible-with=7) are sent: OpenSearch refuses them
// with a 406. olivere checks neither the product header nor the version.
func NewElasticClient(o ElasticOptions) (*elastic.Client, error) {
	nodes, user, password, err := ParseNodes(o.URL)
	if err != nil {
		return nil, err
	}
	if (user != "" || password != "") && o.APIKey != "" {
		return nil, bounds.Exclusive("APIKey", "a user in the URL is basic auth; use one way to authenticate", "URL")
	}
	o.Username = cmp.Or(o.Username, user)
	o.Password = cmp.Or(o.Password, password)
	o.Timeout = cmp.Or(o.Timeout, TimeoutDefault)
	if err := bounds.Check("Timeout", o.Timeout, TimeoutRange); err != nil {
		return nil, err
	}

	if err := o.ValidateAuth(); err != nil {
		return nil, err
	}

	tr, err := transport(o.CAFile)
	if err != nil {
		return nil, err
	}
	// Credentials go on below the node picker, so that its probes carry
	// them too.
	var rt http.RoundTripper = tr
	if auth := o.authorization(); auth != "" {
		rt = &authTransport{next: rt, authorization: auth}
	}
	if len(nodes) > 1 {
		rt = newNodePicker(nodes, rt)
	}
	hc := &http.Client{
		Transport: &retryAfterTransport{next: rt},
		Timeout:   o.Timeout,
	}
	var doer elastic.Doer = hc
	if len(nodes) > 1 {
		doer = nodeNamingClient{hc}
	}

	client, err := elastic.NewClient(
		// With several nodes olivere's URL is the first node's; the
		// transport sends each request to the node it picks.
		elastic.SetURL(nodes[0].String()),
		elastic.SetHttpClient(doer),
		elastic.SetSniff(false),
		elastic.SetHealthcheck(false),
		elastic.SetRetrier(reviveRetrier{}),
		elastic.SetRetryStatusCodes(),
	)
	if err != nil {
		return nil, err
	}
	clientTimeouts.Store(client, o.Timeout)
	return client, nil
}

// ValidateAuth checks the credentials: an API key in one of its two forms,
// and not with basic auth. Its errors never hold a credential.
func (o ElasticOptions) ValidateAuth() error {
	if o.APIKey == "" {
		return nil
	}
	if o.Username != "" || o.Password != "" {
		return bounds.Exclusive("APIKey", "use one way to authenticate", "Username", "Password")
	}
	_, err := encodeAPIKey(o.APIKey)
	return err
}

// authorization is the Authorization header of every request: the API key,
// else basic auth, else none.
func (o ElasticOptions) authorization() string {
	if o.APIKey != "" {
		encoded, _ := encodeAPIKey(o.APIKey)
		return "ApiKey " + encoded
	}
	if o.Username != "" || o.Password != "" {
		return "Basic " + base64.StdEncoding.EncodeToString([]byte(o.Username+":"+o.Password))
	}
	return ""
}

// encodeAPIKey is key, the id:key pair or its base64 form, as the ApiKey
// scheme sends it: base64(id:key). Base64 has no colon, so a colon tells
// the forms apart.
func encodeAPIKey(key string) (string, error) {
	key = strings.TrimSpace(key)
	pair := key
	if !strings.Contains(key, ":") {
		b, err := base64.StdEncoding.DecodeString(key)
		if err != nil {
			b, err = base64.RawStdEncoding.DecodeString(key)
		}
		if err != nil {
			return "", errMalformedAPIKey
		}
		pair = string(b)
	}
	id, secret, ok := strings.Cut(pair, ":")
	if !ok || id == "" || secret == "" || strings.IndexFunc(pair, func(r rune) bool { return r <= ' ' || r > '~' }) >= 0 {
		return "", errMalformedAPIKey
	}
	return base64.StdEncoding.EncodeToString([]byte(pair)), nil
}

// errMalformedAPIKey names the setting, never its value.
var errMalformedAPIKey = bounds.Invalid("APIKey",
	`must be the id:key pair or its base64 form (the "encoded" of the create-API-key answer)`)

// authTransport sets the Authorization header of every request, on a copy:
// a RoundTripper must not change its request.
type authTransport struct {
	next          http.RoundTripper
	authorization string
}

func (t *authTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set("Authorization", t.authorization)
	return t.next.RoundTrip(req)
}

// transport is the engine client's: few idle connections, writes bound by
// the socket's timeouts (boundWrites), HTTP/1.1 only, and caFile's CAs for
// https when given.
func transport(caFile string) (*http.Transport, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = idleConnsPerHost
	dialer := &net.Dialer{Timeout: dialTimeout, KeepAlive: keepAlive, Control: boundWrites}
	tr.DialContext = dialer.DialContext
	tr.TLSHandshakeTimeout = dialTimeout
	// HTTP/1.1 only: a cancelled bulk then closes its own connection, and
	// the abortive close discards what it had not sent. HTTP/2 would cancel
	// a stream and keep the connection, whose kernel would still deliver
	// the bulk's queued bytes. Elasticsearch speaks HTTP/1.1 alone anyway.
	tr.Protocols = new(http.Protocols)
	tr.Protocols.SetHTTP1(true)
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("elastic: CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("elastic: CA file %s holds no PEM certificate", caFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return tr, nil
}

// reviveRetrier makes olivere send every request exactly once. After a failed
// request olivere marks the node dead; with sniffing and health checks off it
// then fails the next request with ErrNoClient without sending it, reviving
// the node in passing. Retrying that one case, at once, sends the request, so
// that each attempt the loop counts is a real one.
type reviveRetrier struct{}

func (reviveRetrier) Retry(_ context.Context, retry int, req *http.Request, resp *http.Response, err error) (time.Duration, bool, error) {
	if retry == 1 && req == nil && resp == nil && errors.Is(err, elastic.ErrNoClient) {
		return 0, true, nil
	}
	return 0, false, nil
}

// olivere's *elastic.Error keeps the status and body of a failed response but
// not its headers, so the transport records a 429's Retry-After in a holder
// that the caller put into the request's context.
type retryAfterKey struct{}

type retryAfterHolder struct {
	mu sync.Mutex
	d  time.Duration
}

func (h *retryAfterHolder) set(d time.Duration) {
	h.mu.Lock()
	h.d = d
	h.mu.Unlock()
}

func (h *retryAfterHolder) get() time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.d
}

func withRetryAfter(ctx context.Context) (context.Context, *retryAfterHolder) {
	h := &retryAfterHolder{}
	return context.WithValue(ctx, retryAfterKey{}, h), h
}

type retryAfterTransport struct {
	next http.RoundTripper
}

func (t *retryAfterTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusTooManyRequests {
		if h, ok := req.Context().Value(retryAfterKey{}).(*retryAfterHolder); ok {
			h.set(parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()))
		}
	}
	return resp, err
}

// parseRetryAfter reads delay-seconds or an HTTP date (RFC 9110 10.2.3); it
// returns 0 for a missing, malformed or past value.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs <= 0 {
			return 0
		}
		if secs > int64(classify.RetryAfterMax/time.Second) {
			return classify.RetryAfterMax
		}
		return time.Duration(secs) * time.Second
	}
	if at, err := http.ParseTime(v); err == nil {
		return min(max(at.Sub(now), 0), classify.RetryAfterMax)
	}
	return 0
}

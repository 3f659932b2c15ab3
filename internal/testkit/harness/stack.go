package harness

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// RepoRoot is the wlproj checkout holding the working directory.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.Contains(b, []byte("module github.com/wlproj/wlproj\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("run from the wlproj checkout (go.mod of github.com/wlproj/wlproj not found)")
		}
		dir = parent
	}
}

// Root is RepoRoot for tests.
func Root(t testing.TB) string {
	t.Helper()
	root, err := RepoRoot()
	require.NoError(t, err)
	return root
}

// testdata reads a file of the checkout's testdata directory.
func testdata(name string) ([]byte, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	return os.ReadFile(filepath.Join(root, "testdata", name))
}

var (
	stackOnce sync.Once
	stackEnv  map[string]string
)

// StackEnv returns the variables scripts/stack.sh wrote to the env file of
// the stack under test: WLPROJ_STACK_ENV, which `stack.sh exec` and
// `stack.sh with` set for each engine of the matrix, else .stack/env. None if
// the stack was not started from this checkout.
func StackEnv(t testing.TB) map[string]string {
	t.Helper()
	root := Root(t)
	stackOnce.Do(func() {
		stackEnv = map[string]string{}
		path := os.Getenv("WLPROJ_STACK_ENV")
		if path == "" {
			path = filepath.Join(root, ".stack", "env")
		}
		if vars, err := readEnvFile(path); err == nil {
			stackEnv = vars
		}
	})
	return stackEnv
}

// readEnvFile reads the variables of an env file stack.sh wrote.
func readEnvFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	vars := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimPrefix(sc.Text(), "export ")
		if k, v, ok := strings.Cut(line, "="); ok {
			vars[k] = strings.Trim(v, "'")
		}
	}
	return vars, sc.Err()
}

func lookup(t testing.TB, override, key string) string {
	t.Helper()
	if v := os.Getenv(override); v != "" {
		return v
	}
	if v := StackEnv(t)[key]; v != "" {
		return v
	}
	t.Fatalf("no %s: run `make stack-up` (or set %s)", key, override)
	return ""
}

// AdminDatabaseURL is a superuser's URL on the test Postgres.
func AdminDatabaseURL(t testing.TB) string {
	return lookup(t, "WLPROJ_TEST_DATABASE_URL", "DATABASE_URL")
}

// ElasticURL is the base URL of the test engine.
func ElasticURL(t testing.TB) string {
	return lookup(t, "WLPROJ_TEST_ELASTIC_URL", "ELASTIC_URL")
}

// UniqueName is prefix and 12 random hex digits: a database, index or role
// name no parallel test or run shares, or a throwaway password.
func UniqueName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// FreePort returns a loopback port that was free a moment ago, picked
// below the kernel's ephemeral range: a port of that range can be taken by
// any outgoing connection's source port before its server binds it (with
// three stacks side by side a replica found its port so taken: "address
// already in use"). Below the range only another FreePort can pick it.
func FreePort() (int, error) {
	// Below a range that starts too low to leave room, any free port.
	span := max(ephemeralLow()-firstFreePort, 0)
	for i := 0; i < 100 && span >= 1000; i++ {
		port := firstFreePort + mrand.IntN(span)
		if ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port)); err == nil {
			ln.Close()
			return port, nil
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// firstFreePort is the lowest port FreePort picks: above the well-known
// and registered ports services of the machine tend to listen on.
const firstFreePort = 10000

// ephemeralLow is the first port of the kernel's ephemeral range (Linux's
// default when it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if lo, _, ok := strings.Cut(strings.TrimSpace(string(b)), "\t"); err == nil && ok {
		if n, err := strconv.Atoi(strings.TrimSpace(lo)); err == nil {
			return n
		}
	}
	return 32768
}

// Port is FreePort for tests; nothing listens on it.
func Port(t testing.TB) int {
	t.Helper()
	port, err := FreePort()
	require.NoError(t, err)
	return port
}

// UserURL is dbURL logged in as user (empty keeps the URL's) with password.
func UserURL(dbURL, user, password string) (string, error) {
	u, err := url.Parse(dbURL)
	if err != nil {
		return "", err
	}
	if user == "" {
		user = u.User.Username()
	}
	u.User = url.UserPassword(user, password)
	return u.String(), nil
}

// EngineInfo is what the engine under test says it is.
type EngineInfo struct {
	// Name is its line as scripts/stack.sh names it: distribution and major
	// version, e.g. "elasticsearch-8" or "opensearch-2"; testdata/<Name>
	// holds its captured responses.
	Name         string
	Distribution string
	Version      string
}

var (
	engineMu    sync.Mutex
	engineCache = map[string]EngineInfo{}
)

// Engine identifies the engine at ElasticURL, once per test binary.
func Engine(t testing.TB) EngineInfo {
	t.Helper()
	base := ElasticURL(t)
	engineMu.Lock()
	defer engineMu.Unlock()
	if e, ok := engineCache[base]; ok {
		return e
	}
	e, err := IdentifyEngine(context.Background(), base)
	require.NoError(t, err)
	engineCache[base] = e
	return e
}

// IdentifyEngine asks the engine at base what it is: GET /, or where the
// root endpoint is missing (Elasticsearch 8's integ-test zip lacks the
// rest-root module) the local node's info. projection.Identify does the same
// for the daemon; the projection tests check that the two agree.
func IdentifyEngine(ctx context.Context, base string) (EngineInfo, error) {
	var root struct {
		Version struct {
			Number       string `json:"number"`
			Distribution string `json:"distribution"`
		} `json:"version"`
	}
	err := ES(ctx, base, http.MethodGet, "/", nil, &root)
	if se := (*StatusError)(nil); errors.As(err, &se) && (se.Code == http.StatusMethodNotAllowed || se.Code == http.StatusNotFound) {
		var info struct {
			Nodes map[string]struct {
				Version string `json:"version"`
			} `json:"nodes"`
		}
		// Only Elasticsearch lacks GET /: OpenSearch's minimal zip has it.
		root.Version.Distribution = "elasticsearch"
		err = ES(ctx, base, http.MethodGet, "/_nodes/_local?filter_path=nodes.*.version", nil, &info)
		for _, n := range info.Nodes {
			root.Version.Number = n.Version
		}
	}
	if err != nil {
		return EngineInfo{}, fmt.Errorf("identify the engine at %s: %w", base, err)
	}
	e := EngineInfo{Distribution: cmp.Or(root.Version.Distribution, "elasticsearch"), Version: root.Version.Number}
	major, _, _ := strings.Cut(e.Version, ".")
	if major == "" {
		return e, fmt.Errorf("identify the engine at %s: no version number", base)
	}
	e.Name = e.Distribution + "-" + major
	return e, nil
}

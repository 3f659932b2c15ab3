package harness

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha512"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// CA is a throwaway certificate authority, for tests of TLS to the engine.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// PEM is the CA's certificate, what ELASTIC_CA_FILE holds.
	PEM []byte
}

// NewCA makes a CA valid for a day.
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// Pool is a pool holding only the CA.
func (ca *CA) Pool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	return pool
}

// Issue signs a server certificate for 127.0.0.1 and localhost and returns
// it and its key in PEM.
func (ca *CA) Issue() (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, nil, err
	}
	// PKCS#8: the one key format every engine's TLS loader reads.
	pk, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pk}), nil
}

// TLSConfig is a server's configuration with a certificate the CA issued.
func (ca *CA) TLSConfig() (*tls.Config, error) {
	certPEM, keyPEM, err := ca.Issue()
	if err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// SecuredConfig says how to start a secured node.
type SecuredConfig struct {
	// CA issues the node's HTTP certificate.
	CA *CA
	// User and Password are the one user of the node's file realm, a
	// superuser.
	User, Password string
	// Heap is the JVM heap. Defaults to 384m.
	Heap string
	// APIKeys makes the node able to create API keys (see storesAPIKeys).
	// It costs a compilation at start, so only tests of keys ask for it.
	APIKeys bool
}

// SecuredNode is a node of its own of the stack's Elasticsearch, with the
// engine's own security on: HTTPS with a certificate of the given CA, and
// basic auth. Elasticsearch's integ-test zips carry x-pack security;
// OpenSearch's carry no security plugin, so there is no secured OpenSearch.
type SecuredNode struct {
	// URL is https://127.0.0.1:port, without credentials.
	URL    string
	Engine EngineInfo
	cfg    SecuredConfig
	cmd    *exec.Cmd
	dir    string
	exited chan struct{}
	// javaOpts is ES_JAVA_OPTS: the heap and the stack's own options.
	javaOpts string
}

// ErrNoSecuredNode says why the stack cannot start a secured node.
var ErrNoSecuredNode = errors.New("no secured node")

// StartSecuredNode starts a single secured node from the distribution the
// stack under test runs (stackEnv: StackEnv), on free loopback ports, as the
// stack's unprivileged user, and waits until it answers the user. It fails
// with ErrNoSecuredNode when the engine is not Elasticsearch or was not
// started by scripts/stack.sh.
func StartSecuredNode(ctx context.Context, stackEnv map[string]string, engine EngineInfo, cfg SecuredConfig) (*SecuredNode, error) {
	home, javaHome := stackEnv["STACK_ENGINE_HOME"], stackEnv["STACK_JAVA_HOME"]
	if engine.Distribution != "elasticsearch" || home == "" || javaHome == "" {
		return nil, fmt.Errorf("%w: %s from %q", ErrNoSecuredNode, engine.Name, home)
	}
	if cfg.Heap == "" {
		cfg.Heap = "384m"
	}
	// Under /tmp, not t.TempDir: the unprivileged user must reach it.
	dir, err := os.MkdirTemp("", "wlproj-secured-")
	if err != nil {
		return nil, err
	}
	// The stack's own JVM options too (make test's C1-only JIT), so a
	// secured node costs what the stack's node does.
	n := &SecuredNode{dir: dir, Engine: engine, cfg: cfg, exited: make(chan struct{}),
		javaOpts: strings.TrimSpace("-Xms" + cfg.Heap + " -Xmx" + cfg.Heap + " " + stackEnv["STACK_ENGINE_JAVA_OPTS"])}
	if err := n.start(ctx, home, javaHome, stackEnv["STACK_RUN_USER"], cfg); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

func (n *SecuredNode) start(ctx context.Context, home, javaHome, runUser string, cfg SecuredConfig) error {
	conf := filepath.Join(n.dir, "config")
	if err := n.configure(home, conf, cfg); err != nil {
		return err
	}
	if cfg.APIKeys {
		var err error
		if home, err = n.storesAPIKeys(home, javaHome); err != nil {
			return fmt.Errorf("a home that stores API keys: %w", err)
		}
	}
	httpPort, err := FreePort()
	if err != nil {
		return err
	}
	if err := n.launch(home, javaHome, conf, runUser, httpPort); err != nil {
		return err
	}
	n.URL = "https://127.0.0.1:" + strconv.Itoa(httpPort)
	if err := n.waitHealthy(ctx, cfg); err != nil {
		return fmt.Errorf("%w\n%s", err, n.logTail())
	}
	return nil
}

// configure copies the distribution's config with the node's certificate,
// the one user, and jvm.options without the GC logs and heap dumps that
// would land relative to the working directory.
func (n *SecuredNode) configure(home, conf string, cfg SecuredConfig) error {
	if out, err := exec.Command("cp", "-r", filepath.Join(home, "config"), conf).CombinedOutput(); err != nil {
		return fmt.Errorf("copy config: %v: %s", err, out)
	}
	certPEM, keyPEM, err := cfg.CA.Issue()
	if err != nil {
		return err
	}
	hash, err := pbkdf2Hash(cfg.Password)
	if err != nil {
		return err
	}
	files := map[string][]byte{
		"node.crt":    certPEM,
		"node.key":    keyPEM,
		"users":       []byte(cfg.User + ":" + hash + "\n"),
		"users_roles": []byte("superuser:" + cfg.User + "\n"),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(conf, name), data, 0o600); err != nil {
			return err
		}
	}
	jvm := filepath.Join(conf, "jvm.options")
	opts, err := os.ReadFile(jvm)
	if err != nil {
		return err
	}
	var kept []string
	for _, line := range strings.Split(string(opts), "\n") {
		if !strings.Contains(line, "Xlog:gc") && !strings.Contains(line, "HeapDump") {
			kept = append(kept, line)
		}
	}
	return os.WriteFile(jvm, []byte(strings.Join(kept, "\n")), 0o644)
}

// securityAnalysis is an analysis plugin with stand-ins for what the
// .security index's "email" analyzer names: a uax_url_email tokenizer (here
// Lucene's standard one) and pattern_capture and unique filters (here
// passing their tokens through). Elasticsearch keeps API keys in that index,
// and the analysis-common module that provides those is not in the
// integ-test zips, so without them the index, and with it every key, cannot
// be created. The analyzer only reads the email of the native realm's
// users, which these tests have none of.
const securityAnalysis = `package wlproj;

import java.util.Map;
import org.apache.lucene.analysis.TokenStream;
import org.apache.lucene.analysis.Tokenizer;
import org.apache.lucene.analysis.standard.StandardTokenizer;
import org.elasticsearch.index.analysis.TokenFilterFactory;
import org.elasticsearch.index.analysis.TokenizerFactory;
import org.elasticsearch.indices.analysis.AnalysisModule.AnalysisProvider;
import org.elasticsearch.plugins.AnalysisPlugin;
import org.elasticsearch.plugins.Plugin;

public class SecurityAnalysisPlugin extends Plugin implements AnalysisPlugin {
    @Override
    public Map<String, AnalysisProvider<TokenizerFactory>> getTokenizers() {
        return Map.of("uax_url_email", (indexSettings, env, name, settings) -> new TokenizerFactory() {
            @Override
            public String name() {
                return name;
            }

            @Override
            public Tokenizer create() {
                return new StandardTokenizer();
            }
        });
    }

    @Override
    public Map<String, AnalysisProvider<TokenFilterFactory>> getTokenFilters() {
        return Map.of("pattern_capture", SecurityAnalysisPlugin::passThrough, "unique", SecurityAnalysisPlugin::passThrough);
    }

    private static TokenFilterFactory passThrough(Object indexSettings, Object env, String name, Object settings) {
        return new TokenFilterFactory() {
            @Override
            public String name() {
                return name;
            }

            @Override
            public TokenStream create(TokenStream in) {
                return in;
            }
        };
    }
}
`

// storesAPIKeys makes a home of the node's own: the distribution's bin
// copied (its scripts find the home from their own path), its lib and
// modules linked, and plugins holding securityAnalysis, compiled against the
// distribution's jars. It returns the new home.
func (n *SecuredNode) storesAPIKeys(home, javaHome string) (string, error) {
	own := filepath.Join(n.dir, "home")
	build := filepath.Join(n.dir, "plugin-build")
	plugin := filepath.Join(own, "plugins", "wlproj-security-analysis")
	for _, d := range []string{filepath.Join(build, "wlproj"), plugin} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", err
		}
	}
	if out, err := exec.Command("cp", "-r", filepath.Join(home, "bin"), filepath.Join(own, "bin")).CombinedOutput(); err != nil {
		return "", fmt.Errorf("copy bin: %v: %s", err, out)
	}
	for _, d := range []string{"lib", "modules"} {
		if err := os.Symlink(filepath.Join(home, d), filepath.Join(own, d)); err != nil {
			return "", err
		}
	}
	src := filepath.Join(build, "wlproj", "SecurityAnalysisPlugin.java")
	if err := os.WriteFile(src, []byte(securityAnalysis), 0o644); err != nil {
		return "", err
	}
	classes := filepath.Join(build, "classes")
	steps := [][]string{
		{filepath.Join(javaHome, "bin", "javac"), "-d", classes, "-cp", filepath.Join(home, "lib", "*"), src},
		{filepath.Join(javaHome, "bin", "jar"), "cf", filepath.Join(plugin, "wlproj-security-analysis.jar"), "-C", classes, "."},
	}
	for _, step := range steps {
		if out, err := exec.Command(step[0], step[1:]...).CombinedOutput(); err != nil {
			return "", fmt.Errorf("%s: %v: %s", filepath.Base(step[0]), err, out)
		}
	}
	version, err := distributionVersion(home)
	if err != nil {
		return "", err
	}
	descriptor := "description=analysis stand-ins for the security index of a test node\nversion=1.0\n" +
		"name=wlproj-security-analysis\nclassname=wlproj.SecurityAnalysisPlugin\njava.version=17\n" +
		"elasticsearch.version=" + version + "\n"
	return own, os.WriteFile(filepath.Join(plugin, "plugin-descriptor.properties"), []byte(descriptor), 0o644)
}

// distributionVersion is the version in the name of home's server jar,
// lib/elasticsearch-<version>.jar.
func distributionVersion(home string) (string, error) {
	jars, err := filepath.Glob(filepath.Join(home, "lib", "elasticsearch-[0-9]*.jar"))
	if err != nil || len(jars) != 1 {
		return "", fmt.Errorf("no single elasticsearch-<version>.jar in %s/lib: %v", home, jars)
	}
	return strings.TrimSuffix(strings.TrimPrefix(filepath.Base(jars[0]), "elasticsearch-"), ".jar"), nil
}

// launch starts the node with security on and TLS on HTTP only.
func (n *SecuredNode) launch(home, javaHome, conf, runUser string, httpPort int) error {
	transportPort, err := FreePort()
	if err != nil {
		return err
	}
	tmp := filepath.Join(n.dir, "tmp")
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return err
	}
	n.cmd = exec.Command(filepath.Join(home, "bin", "elasticsearch"),
		"-Ediscovery.type=single-node", "-Enetwork.host=127.0.0.1",
		"-Ehttp.port="+strconv.Itoa(httpPort), "-Etransport.port="+strconv.Itoa(transportPort),
		"-Expack.security.enabled=true",
		"-Expack.security.http.ssl.enabled=true",
		"-Expack.security.http.ssl.certificate=node.crt",
		"-Expack.security.http.ssl.key=node.key",
		"-Expack.security.transport.ssl.enabled=false",
		"-Ecluster.routing.allocation.disk.threshold_enabled=false",
		"-Epath.data="+filepath.Join(n.dir, "data"), "-Epath.logs="+filepath.Join(n.dir, "logs"))
	n.cmd.Env = append(os.Environ(), "ES_JAVA_HOME="+javaHome, "ES_PATH_CONF="+conf, "ES_TMPDIR="+tmp,
		"ES_JAVA_OPTS="+n.javaOpts, "HOME="+n.dir)
	log, err := os.Create(filepath.Join(n.dir, "console.log"))
	if err != nil {
		return err
	}
	defer log.Close()
	n.cmd.Stdout, n.cmd.Stderr = log, log
	// Its own process group, so Close reaches the server the launcher
	// starts; and killed with the test process should that die first.
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if os.Getuid() == 0 {
		// Elasticsearch refuses to run as root.
		uid, gid, err := lookupUser(runUser)
		if err != nil {
			return err
		}
		if err := chownTree(n.dir, uid, gid); err != nil {
			return err
		}
		n.cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uid, Gid: gid}
	}
	if err := n.cmd.Start(); err != nil {
		return err
	}
	go func() { _ = n.cmd.Wait(); close(n.exited) }()
	return nil
}

// waitHealthy polls the cluster health over TLS as the user until it answers.
func (n *SecuredNode) waitHealthy(ctx context.Context, cfg SecuredConfig) error {
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: cfg.CA.Pool()}}}
	return Poll(ctx, 3*time.Minute, "secured "+n.Engine.Name+" to answer", func(ctx context.Context) (bool, error) {
		select {
		case <-n.exited:
			return false, Fatal(errors.New("it exited"))
		default:
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, n.URL+"/_cluster/health", nil)
		if err != nil {
			return false, err
		}
		req.SetBasicAuth(cfg.User, cfg.Password)
		resp, err := client.Do(req)
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, fmt.Errorf("status %d", resp.StatusCode)
	})
}

func (n *SecuredNode) logTail() string {
	var out []string
	for _, name := range []string{"console.log", "logs/elasticsearch.log"} {
		data, _ := os.ReadFile(filepath.Join(n.dir, name))
		out = append(out, string(data[max(0, len(data)-3000):]))
	}
	return strings.Join(out, "\n")
}

// Close stops the node's process group and removes its files.
func (n *SecuredNode) Close() {
	if n.cmd != nil && n.cmd.Process != nil {
		_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-n.exited:
		case <-time.After(15 * time.Second):
		}
		// The server may outlive the launcher by a moment.
		_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
		<-n.exited
	}
	_ = os.RemoveAll(n.dir)
}

// Do sends one request to the node as its superuser and decodes a 2xx
// answer's JSON into out, if not nil; any other status is a *StatusError.
func (n *SecuredNode) Do(ctx context.Context, method, path string, body []byte, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, n.URL+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.SetBasicAuth(n.cfg.User, n.cfg.Password)
	client := &http.Client{Timeout: 30 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: n.cfg.CA.Pool()}}}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		return &StatusError{Request: method + " " + path, Code: resp.StatusCode, Body: string(data)}
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(data, out)
}

// APIKey is an API key the node created: its id, its secret, and the
// base64 of id:key that the create answer calls encoded.
type APIKey struct {
	ID      string `json:"id"`
	Key     string `json:"api_key"`
	Encoded string `json:"encoded"`
}

// Pair is the key as id:key.
func (k APIKey) Pair() string { return k.ID + ":" + k.Key }

// CreateAPIKey creates an API key as the superuser (POST /_security/api_key),
// limited to roleDescriptors, a JSON object of role name to descriptor. The
// answer's encoded field is 8.x's; for 7.x it is computed the same way.
func (n *SecuredNode) CreateAPIKey(ctx context.Context, name string, roleDescriptors string) (APIKey, error) {
	body, err := json.Marshal(map[string]any{"name": name, "role_descriptors": json.RawMessage(roleDescriptors)})
	if err != nil {
		return APIKey{}, err
	}
	var k APIKey
	if err := n.Do(ctx, http.MethodPost, "/_security/api_key", body, &k); err != nil {
		return APIKey{}, err
	}
	if k.Encoded == "" {
		k.Encoded = base64.StdEncoding.EncodeToString([]byte(k.Pair()))
	}
	return k, nil
}

// InvalidateAPIKey invalidates the key of id: the node refuses it from then
// on with a 401.
func (n *SecuredNode) InvalidateAPIKey(ctx context.Context, id string) error {
	body, err := json.Marshal(map[string]any{"ids": []string{id}})
	if err != nil {
		return err
	}
	return n.Do(ctx, http.MethodDelete, "/_security/api_key", body, nil)
}

// SecuredEngine is StartSecuredNode for tests, on the stack under test,
// closed when the test ends. It skips the test when the stack cannot start
// one.
func SecuredEngine(t testing.TB, cfg SecuredConfig) *SecuredNode {
	t.Helper()
	n, err := StartSecuredNode(context.Background(), StackEnv(t), Engine(t), cfg)
	if errors.Is(err, ErrNoSecuredNode) {
		t.Skip(err)
	}
	require.NoError(t, err)
	t.Cleanup(n.Close)
	return n
}

// pbkdf2Hash is password as the file realm's users file holds it, in
// Elasticsearch's PBKDF2 format ({PBKDF2}cost$salt$key, HMAC-SHA512, a
// 256-bit key), which the realm recognises by its prefix.
func pbkdf2Hash(password string) (string, error) {
	const cost = 10000
	salt := make([]byte, 32)
	if _, err := rand.Read(salt); err != nil {
		return "", err
	}
	key, err := pbkdf2.Key(sha512.New, password, salt, cost, 32)
	if err != nil {
		return "", err
	}
	enc := base64.StdEncoding.EncodeToString
	return "{PBKDF2}" + strconv.Itoa(cost) + "$" + enc(salt) + "$" + enc(key), nil
}

func lookupUser(name string) (uid, gid uint32, err error) {
	if name == "" {
		return 0, 0, errors.New("no STACK_RUN_USER to run the engine as")
	}
	u, err := user.Lookup(name)
	if err != nil {
		return 0, 0, err
	}
	id, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return 0, 0, err
	}
	g, err := strconv.ParseUint(u.Gid, 10, 32)
	return uint32(id), uint32(g), err
}

func chownTree(dir string, uid, gid uint32) error {
	return filepath.Walk(dir, func(path string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, int(uid), int(gid))
	})
}

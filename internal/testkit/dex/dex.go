// Package dex starts Dex, a real OpenID provider, on a loopback port for a
// test, and stops it when the test ends. The binary is built by
// `scripts/tools.sh dex` (make test runs it) from the module in build/.
package dex

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// User is a person the provider's password database knows.
type User struct {
	Email, Password, Username string
	Groups                    []string
}

// Config is what the provider is started with.
type Config struct {
	// RedirectURIs are the client's registered redirect URIs.
	RedirectURIs []string
	Users        []User
	// Port is the loopback port to serve on. Defaults to a free one.
	Port int
	// Host names the loopback address in the issuer URL: "localhost" puts
	// the provider on another site than a console at 127.0.0.1, as in a
	// browser's eyes a real provider is. Defaults to 127.0.0.1.
	Host string
}

// Provider is a running Dex with one confidential client.
type Provider struct {
	// Issuer is the provider's issuer URL, http://127.0.0.1:PORT/dex.
	Issuer                 string
	ClientID, ClientSecret string
	cmd                    *exec.Cmd
	log                    *syncBuffer
}

// Binary is the Dex that `scripts/tools.sh dex` built, or WLPROJ_DEX. A
// missing binary fails the test rather than skipping it, so that a CI
// without it never passes the sign-in tests unrun.
func Binary(t testing.TB) string {
	t.Helper()
	bin := os.Getenv("WLPROJ_DEX")
	if bin == "" {
		bin = filepath.Join(harness.Root(t), ".cache", "bin", "dex")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("no Dex binary at %s (%v): run `scripts/tools.sh dex` (make test does)", bin, err)
	}
	return bin
}

// Start runs Dex for t on a free loopback port and returns once its
// discovery document answers.
func Start(t testing.TB, cfg Config) *Provider {
	t.Helper()
	bin := Binary(t)
	port := cfg.Port
	if port == 0 {
		var err error
		port, err = harness.FreePort()
		require.NoError(t, err)
	}
	host := cmp.Or(cfg.Host, "127.0.0.1")
	p := &Provider{Issuer: "http://" + host + ":" + strconv.Itoa(port) + "/dex", ClientID: "wlproj-console",
		ClientSecret: rand.Text(), log: &syncBuffer{}}
	file := filepath.Join(t.TempDir(), "dex.json")
	require.NoError(t, os.WriteFile(file, p.config(t, cfg, port), 0o600))
	p.cmd = exec.Command(bin, file)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	require.NoError(t, p.cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- p.cmd.Wait() }()
	t.Cleanup(func() { p.stop(t, exited) })
	p.waitReady(t, exited)
	return p
}

// config is the file build/main.go reads: Dex's own field names.
func (p *Provider) config(t testing.TB, cfg Config, port int) []byte {
	type password struct {
		Email    string   `json:"email"`
		Hash     string   `json:"hash"`
		Username string   `json:"username"`
		UserID   string   `json:"userID"`
		Groups   []string `json:"groups"`
	}
	var passwords []password
	for i, u := range cfg.Users {
		// Dex refuses a cost below 10.
		hash, err := bcrypt.GenerateFromPassword([]byte(u.Password), 10)
		require.NoError(t, err)
		passwords = append(passwords, password{Email: u.Email, Hash: string(hash), Username: u.Username,
			UserID: fmt.Sprintf("user-%d", i+1), Groups: u.Groups})
	}
	b, err := json.Marshal(map[string]any{
		"issuer": p.Issuer,
		"addr":   "127.0.0.1:" + strconv.Itoa(port),
		"staticClients": []map[string]any{{"id": p.ClientID, "secret": p.ClientSecret, "name": "wlproj console",
			"redirectURIs": cfg.RedirectURIs}},
		"staticPasswords": passwords,
	})
	require.NoError(t, err)
	return b
}

func (p *Provider) waitReady(t testing.TB, exited <-chan error) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.Issuer+"/.well-known/openid-configuration", nil)
		resp, err := http.DefaultClient.Do(req)
		cancel()
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case err := <-exited:
			t.Fatalf("dex exited before it answered: %v\n%s", err, p.log.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("dex's discovery did not answer within 20s\n%s", p.log.String())
		}
	}
}

// stop ends Dex with SIGTERM, then SIGKILL if it lingers, and prints its
// log when the test failed.
func (p *Provider) stop(t testing.TB, exited <-chan error) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-exited
	}
	if t.Failed() {
		t.Logf("dex log:\n%s", p.log.String())
	}
}

// Log is what Dex wrote so far.
func (p *Provider) Log() string { return p.log.String() }

// syncBuffer is a bytes.Buffer the process's output goroutines and the
// test may use at once.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

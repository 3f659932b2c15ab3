// Package testenv gives tests their own database and index on the one local
// stack started by `make stack-up` (or on the servers named by
// WLPROJ_TEST_DATABASE_URL / WLPROJ_TEST_ELASTIC_URL), and builds the real
// wlproj binary once per test process.
package testenv

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/migrations"
)

// RepoRoot is the directory holding go.mod.
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		require.NotEqual(t, parent, dir, "go.mod not found above the test directory")
		dir = parent
	}
}

var (
	stackOnce sync.Once
	stackEnv  map[string]string
)

// StackEnv returns the variables written by scripts/stack.sh to .stack/env.
func StackEnv(t testing.TB) map[string]string {
	t.Helper()
	root := RepoRoot(t)
	stackOnce.Do(func() {
		stackEnv = map[string]string{}
		f, err := os.Open(filepath.Join(root, ".stack", "env"))
		if err != nil {
			return
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			line := strings.TrimPrefix(sc.Text(), "export ")
			k, v, ok := strings.Cut(line, "=")
			if ok {
				stackEnv[k] = strings.Trim(v, "'")
			}
		}
	})
	return stackEnv
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

// AdminDatabaseURL is the maintenance database of the test Postgres.
func AdminDatabaseURL(t testing.TB) string {
	return lookup(t, "WLPROJ_TEST_DATABASE_URL", "DATABASE_URL")
}

// ElasticURL is the base URL of the test engine.
func ElasticURL(t testing.TB) string {
	return lookup(t, "WLPROJ_TEST_ELASTIC_URL", "ELASTIC_URL")
}

// UniqueName returns prefix plus a random suffix, safe as a database or index name.
func UniqueName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// DB is a fresh, migrated database that is dropped when the test ends.
type DB struct {
	Name string
	URL  string
	Pool *pgxpool.Pool
}

// NewEmptyDatabase creates a database with no schema in it.
func NewEmptyDatabase(t testing.TB) DB {
	t.Helper()
	ctx := context.Background()
	admin := AdminDatabaseURL(t)
	conn, err := pgx.Connect(ctx, admin)
	require.NoError(t, err)
	defer conn.Close(ctx)
	name := UniqueName("wlproj_t_")
	_, err = conn.Exec(ctx, "CREATE DATABASE "+name)
	require.NoError(t, err)

	u, err := url.Parse(admin)
	require.NoError(t, err)
	u.Path = "/" + name
	db := DB{Name: name, URL: u.String()}
	db.Pool, err = pgxpool.New(ctx, db.URL)
	require.NoError(t, err)
	t.Cleanup(func() {
		db.Pool.Close()
		c, err := pgx.Connect(context.Background(), admin)
		if err != nil {
			t.Logf("drop %s: %v", name, err)
			return
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Logf("drop %s: %v", name, err)
		}
	})
	return db
}

// NewDatabase creates a database with the outbox schema applied.
func NewDatabase(t testing.TB) DB {
	t.Helper()
	db := NewEmptyDatabase(t)
	_, err := migrations.Up(context.Background(), db.URL, migrations.Expect{Database: db.Name})
	require.NoError(t, err)
	return db
}

// NewIndexName returns an index name of the test's own; the index, if the
// test creates it, is deleted when the test ends.
func NewIndexName(t testing.TB) string {
	t.Helper()
	name := UniqueName("wlproj-t-")
	base := ElasticURL(t)
	t.Cleanup(func() {
		req, _ := http.NewRequest(http.MethodDelete, base+"/"+name+"?ignore_unavailable=true", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	})
	return name
}

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
)

// Binary builds ./ into a temporary directory once per test process and
// returns the path of the wlproj executable.
func Binary(t testing.TB) string {
	t.Helper()
	root := RepoRoot(t)
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "wlproj-bin-")
		if err != nil {
			buildErr = err
			return
		}
		buildPath = filepath.Join(dir, "wlproj")
		cmd := exec.Command("go", "build", "-o", buildPath, ".")
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	require.NoError(t, buildErr)
	return buildPath
}

// Eventually polls cond every 20ms until it holds or timeout passes.
func Eventually(t testing.TB, timeout time.Duration, msg string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for: %s", timeout, msg)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

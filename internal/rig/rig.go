// Package rig is what the failover drill and the benchmarks share outside
// of the daemon: finding the checkout, building the binary, naming things
// uniquely, pacing a producer and summarising samples.
package rig

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/wlproj/wlproj/migrations"
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

// Build compiles the checkout at root into dir and returns the binary's path.
func Build(ctx context.Context, root, dir string) (string, error) {
	bin := filepath.Join(dir, "wlproj")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %w\n%s", err, out)
	}
	return bin, nil
}

// RandomHex is n random bytes in hex: names of databases, roles, indices.
func RandomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Pace calls insert every tick with the number of events due, so that rate
// events a second are asked for since the start; a late tick (a busy
// machine) asks for what the ticks it missed would have, until ctx ends.
func Pace(ctx context.Context, rate int, tick time.Duration, insert func(n int)) {
	t := time.NewTicker(tick)
	defer t.Stop()
	start := time.Now()
	var asked int64
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			due := int64(float64(rate) * now.Sub(start).Seconds())
			if n := due - asked; n > 0 {
				asked = due
				insert(int(n))
			}
		}
	}
}

// Stats summarises a few samples.
type Stats struct {
	Min     float64   `json:"min"`
	Median  float64   `json:"median"`
	Max     float64   `json:"max"`
	Samples []float64 `json:"samples"`
}

// NewStats is nil for no samples. Figures are rounded to 3 decimals.
func NewStats(samples []float64) *Stats {
	if len(samples) == 0 {
		return nil
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	rounded := make([]float64, len(samples))
	for i, v := range samples {
		rounded[i] = Round3(v)
	}
	return &Stats{Min: Round3(s[0]), Median: Round3(med), Max: Round3(s[len(s)-1]), Samples: rounded}
}

// Round3 rounds to 3 decimals, enough for milliseconds in seconds.
func Round3(f float64) float64 { return math.Round(f*1000) / 1000 }

// CreateDatabase creates the database name on the admin's server, applies
// the migrations to it and returns its URL.
func CreateDatabase(ctx context.Context, admin *pgx.Conn, adminURL, name string) (string, error) {
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", err
	}
	u, err := url.Parse(adminURL)
	if err != nil {
		return "", fmt.Errorf("DATABASE_URL: %w", err)
	}
	u.Path = "/" + name
	if _, err := migrations.Up(ctx, u.String(), migrations.Expect{Database: name}); err != nil {
		return "", err
	}
	return u.String(), nil
}

// Get returns the body of a 200 answer to GET u; the caller closes it.
func Get(ctx context.Context, u string) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	return resp.Body, nil
}

// ES sends one request to the engine at base and decodes a 2xx answer into
// out (if not nil); any other status is an error quoting the engine.
func ES(ctx context.Context, base, method, path string, body []byte, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(base, "/")+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(data))
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}

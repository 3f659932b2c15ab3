package harness

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// Build compiles the checkout into dir and returns the binary's path.
func Build(ctx context.Context, dir string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "wlproj")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %w\n%s", err, out)
	}
	return bin, nil
}

// testBinaryEnv names a binary built from this checkout for every test
// process of a run to share (the Makefile's test targets set it).
const testBinaryEnv = "WLPROJ_TEST_BINARY"

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
)

// Binary is Build for tests: once per test process, into a directory that
// outlives the test that happened to build it; or, with WLPROJ_TEST_BINARY
// set, that binary: make test builds it once for every package of a run,
// where each test process's own build cost a link of its own (20 of them
// a run, the machine's two cores shared with everything else).
func Binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		if prebuilt := os.Getenv(testBinaryEnv); prebuilt != "" {
			if _, buildErr = os.Stat(prebuilt); buildErr != nil {
				buildErr = fmt.Errorf("%s: %w", testBinaryEnv, buildErr)
			}
			buildPath = prebuilt
			return
		}
		dir, err := os.MkdirTemp("", "wlproj-bin-")
		if err != nil {
			buildErr = err
			return
		}
		buildPath, buildErr = Build(context.Background(), dir)
	})
	require.NoError(t, buildErr)
	return buildPath
}

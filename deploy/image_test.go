package deploy

import (
	"bytes"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// builtImage is what one `make image` gave: the id podman's store holds
// under the tag, and the archive it wrote.
type builtImage struct {
	id      string
	archive []byte
}

// makeImage runs `make image` as an operator would, into a directory of
// its own, with env (SOURCE_DATE_EPOCH) instead of the test's own.
func makeImage(t *testing.T, root, ref string, env ...string) builtImage {
	t.Helper()
	dir := t.TempDir()
	build := exec.Command("make", "--no-print-directory", "image", "IMAGE="+ref, "IMAGE_DIR="+dir)
	build.Dir = root
	build.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "SOURCE_DATE_EPOCH=") })
	build.Env = append(build.Env, env...)
	out, err := build.CombinedOutput()
	require.NoError(t, err, "make image:\n%s", out)
	archives, err := filepath.Glob(filepath.Join(dir, "wlproj_*.image.tar"))
	require.NoError(t, err)
	require.Len(t, archives, 1, "make image writes one archive:\n%s", out)
	return builtImage{
		id:      podmanOutput(t, root, "image", "inspect", "--format", "{{.Id}}", ref),
		archive: mustRead(t, archives[0]),
	}
}

// podman is podman with the project's containers.conf, as make image runs it.
func podman(root string, args ...string) *exec.Cmd {
	cmd := exec.Command("podman", args...)
	cmd.Env = append(os.Environ(), "CONTAINERS_CONF="+filepath.Join(root, "deploy/image/containers.conf"))
	return cmd
}

// podmanOutput runs podman and returns its trimmed standard output.
func podmanOutput(t *testing.T, root string, args ...string) string {
	t.Helper()
	var stderr bytes.Buffer
	cmd := podman(root, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "podman %v: %s", args, stderr.String())
	return strings.TrimSpace(string(out))
}

// TestImageIsReproducible builds the image twice from the same checkout
// and asserts the same image id and the same archive: podman build
// --timestamp alone leaves the build container's id and hostname in a
// docker-format configuration, and the build time in the binary and the
// created label. Both builds are dated by a SOURCE_DATE_EPOCH of the
// test's own, so that no other build (e2e's TestImage, run alongside) has
// the same image. A third build, without it, is dated by the commit, and
// removes the image the tag named, which it would otherwise leave
// dangling. About 10-20 s a build with warm Go and podman caches, 100 s
// cold; `go test -short` skips it.
func TestImageIsReproducible(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the image three times")
	}
	t.Parallel()
	requireTool(t, "podman")
	root := harness.Root(t)
	ref := "localhost/" + harness.UniqueName("wlproj-repro-") + ":test"
	t.Cleanup(func() {
		if out, err := podman(root, "rmi", "--force", ref).CombinedOutput(); err != nil {
			t.Logf("podman rmi %s: %v\n%s", ref, err, out)
		}
	})
	epoch := strconv.Itoa(1_500_000_000 + rand.IntN(100_000_000))

	first := makeImage(t, root, ref, "SOURCE_DATE_EPOCH="+epoch)
	second := makeImage(t, root, ref, "SOURCE_DATE_EPOCH="+epoch)
	require.Equal(t, first.id, second.id, "two builds of one checkout give one image id")
	require.True(t, bytes.Equal(first.archive, second.archive), "two builds of one checkout write the same archive")
	require.Equal(t, epoch, podmanOutput(t, root, "image", "inspect", "--format", "{{.Created.Unix}}", ref))

	license := podmanOutput(t, root, "image", "inspect", "--format",
		`{{index .Labels "org.opencontainers.image.licenses"}}`, ref)
	require.Equal(t, "Apache-2.0", license, "the licenses label names LICENSE's license")
	require.Contains(t, string(mustRead(t, filepath.Join(root, "LICENSE"))), "Apache License\n                           Version 2.0")

	byCommit := makeImage(t, root, ref)
	require.NotEqual(t, first.id, byCommit.id)
	commitTime := strings.TrimSpace(run(t, "git", "-C", root, "log", "-1", "--format=%ct"))
	require.Equal(t, commitTime, podmanOutput(t, root, "image", "inspect", "--format", "{{.Created.Unix}}", ref),
		"without SOURCE_DATE_EPOCH the commit's time dates the image")
	err := podman(root, "image", "exists", first.id).Run()
	require.Error(t, err, "the rebuild removed the image the tag named before, which nothing else used")
}

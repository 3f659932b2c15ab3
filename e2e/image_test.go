package e2e

// The container image (`make image`, deploy/image/) run as an operator
// runs it with Debian's podman: `wlproj migrate` as a one-off container,
// then containers of the image against the test stack, with host
// networking (the stack listens on loopback) and the read-only root, no
// capabilities and no new privileges that deploy/k8s/ gives a pod. Podman
// reads deploy/image/containers.conf (CONTAINERS_CONF), never the
// machine's own settings. Each test ends with the drill's verdict.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/faultproxy"
	"github.com/wlproj/wlproj/internal/testkit/harness"
)

const (
	// imageStopTimeout is the containers' --stop-timeout, as the runbook
	// gives it: how long podman stop waits for the drain before SIGKILL,
	// the unit's TimeoutStopSec.
	imageStopTimeout = 45 * time.Second
	// takeoverBound is the usual bound on a takeover after kill -9: the new
	// leader's first ack within 10 s of the kill, as
	// TestReplicasKill9LeaderMidStream allows.
	takeoverBound = 10 * time.Second
	// imageMaxBytes bounds the image's size: a static binary, the CA
	// bundle and the probe.
	imageMaxBytes = 64 << 20
	// imageUser is the image's numeric user, which deploy/k8s/ runs as.
	imageUser = "65532:65532"
)

// containerFlags are the podman run flags of every container of the image:
// what deploy/k8s/'s pods get (read-only root, no capabilities, no new
// privileges) and the runbook's stop timeout.
var containerFlags = []string{
	"--network", "host", "--read-only", "--cap-drop", "all", "--security-opt", "no-new-privileges",
	"--stop-timeout", strconv.Itoa(int(imageStopTimeout.Seconds())),
}

// image is one image built by `make image` for a test, removed when it ends.
type image struct {
	ref     string
	archive string
	conf    string
}

// buildImage runs `make image` as an operator would, under a tag of the
// test's own.
func buildImage(t *testing.T) image {
	t.Helper()
	if _, err := exec.LookPath("podman"); err != nil {
		t.Fatal("podman is not installed: run scripts/tools.sh (as root) to install it")
	}
	root := harness.Root(t)
	dir := t.TempDir()
	img := image{ref: "localhost/" + harness.UniqueName("wlproj-t-") + ":test",
		conf: filepath.Join(root, "deploy/image/containers.conf")}
	build := exec.Command("make", "--no-print-directory", "image", "IMAGE="+img.ref, "IMAGE_DIR="+dir)
	build.Dir = root
	out, err := build.CombinedOutput()
	require.NoError(t, err, "make image:\n%s", out)
	t.Cleanup(func() {
		if out, err := img.podman("rmi", "--force", img.ref).CombinedOutput(); err != nil {
			t.Logf("podman rmi %s: %v\n%s", img.ref, err, out)
		}
	})
	archives, err := filepath.Glob(filepath.Join(dir, "wlproj_*.image.tar"))
	require.NoError(t, err)
	require.Len(t, archives, 1, "make image writes one archive")
	img.archive = archives[0]
	return img
}

// podman is podman with the project's containers.conf.
func (img image) podman(args ...string) *exec.Cmd {
	cmd := exec.Command("podman", args...)
	cmd.Env = append(os.Environ(), "CONTAINERS_CONF="+img.conf)
	return cmd
}

// oneOff runs the image once with args, as the runbook's one-off commands
// do (no health check: nothing serves /healthz), env passed by name
// (values stay out of podman's command line), and returns its standard
// output; a failure's error carries the standard error.
func (img image) oneOff(env []string, args ...string) ([]byte, error) {
	run := slices.Concat([]string{"run", "--rm", "--no-healthcheck"}, containerFlags)
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		run = append(run, "--env", name)
	}
	cmd := img.podman(slices.Concat(run, []string{img.ref}, args)...)
	cmd.Env = append(cmd.Env, env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%w\n%s", err, stderr.String())
	}
	return out, nil
}

// containers runs replicas of the image for a cluster: harness.Start runs
// a launcher script as the binary, which hands the replica's settings to
// podman by name, so every harness wait works on a container as on a process.
type containers struct {
	t        *testing.T
	img      image
	prefix   string
	launcher string
}

func newContainers(t *testing.T, img image, c *cluster) *containers {
	t.Helper()
	cs := &containers{t: t, img: img, prefix: harness.UniqueName("wlproj-t-"),
		launcher: filepath.Join(t.TempDir(), "wlproj-in-podman")}
	// Start adds the worker id and the ports to the cluster's settings.
	names := []string{"OUTBOX_WORKER_ID", "OUTBOX_HTTP_PORT", "OUTBOX_METRICS_PORT"}
	for _, kv := range c.env {
		name, _, _ := strings.Cut(kv, "=")
		names = append(names, name)
	}
	script := "#!/bin/sh\n# harness.Start runs \"$0 run\": the image's command instead of the binary.\n" +
		"exec podman run --rm --name \"" + cs.prefix + "-$OUTBOX_WORKER_ID\" " + strings.Join(containerFlags, " ") +
		" --env " + strings.Join(names, " --env ") + " " + img.ref + " \"$@\"\n"
	require.NoError(t, os.WriteFile(cs.launcher, []byte(script), 0o755))
	c.env = append(c.env, "CONTAINERS_CONF="+img.conf)
	return cs
}

// name is the container of the replica named replica.
func (cs *containers) name(replica string) string { return cs.prefix + "-" + replica }

// start runs a container of c's replica name and waits until it serves
// /healthz; the container is removed when the test ends.
func (cs *containers) start(c *cluster, name string) *harness.Replica {
	cs.t.Helper()
	// Registered first, so it runs last: a container whose podman client
	// was killed outlives it.
	cs.t.Cleanup(func() { _ = cs.img.podman("rm", "--force", "--time", "0", cs.name(name)).Run() })
	r, err := harness.Start(cs.launcher, name, c.env, nil)
	require.NoError(cs.t, err)
	cs.t.Cleanup(func() {
		r.Stop(imageStopTimeout)
		if cs.t.Failed() {
			logs := r.Logs()
			cs.t.Logf("logs of container %s:\n%s", cs.name(name), logs[max(0, len(logs)-4000):])
		}
	})
	c.replicas = append(c.replicas, r)
	harness.Healthy(cs.t, r)
	return r
}

// stop is `podman stop`: SIGTERM, SIGKILL after the stop timeout. It
// returns how long the container took and its exit code.
func (cs *containers) stop(r *harness.Replica) (time.Duration, int) {
	cs.t.Helper()
	start := time.Now()
	out, err := cs.img.podman("stop", cs.name(r.Name)).CombinedOutput()
	require.NoError(cs.t, err, "podman stop:\n%s", out)
	code, err := r.ExitCode(10 * time.Second)
	require.NoError(cs.t, err)
	return time.Since(start), code
}

// kill is `podman kill -s KILL`; it returns once the container is gone.
func (cs *containers) kill(r *harness.Replica) {
	cs.t.Helper()
	out, err := cs.img.podman("kill", "--signal", "KILL", cs.name(r.Name)).CombinedOutput()
	require.NoError(cs.t, err, "podman kill:\n%s", out)
	_, err = r.ExitCode(10 * time.Second)
	require.NoError(cs.t, err)
}

// imageCluster is a cluster on db (empty or migrated) whose replicas are
// containers of img.
func imageCluster(t *testing.T, img image, db harness.DB) (*cluster, *containers) {
	t.Helper()
	c := &cluster{t: t, db: db, index: harness.NewIndex(t)}
	c.proxy = faultproxy.Start(t, harness.ElasticURL(t))
	c.env = harness.ReplicaEnv(c.db.URL, c.proxy.URL(), c.index, harness.Quick...)
	return c, newContainers(t, img, c)
}

// TestImage builds the image once with make image and checks it three
// ways side by side.
func TestImage(t *testing.T) {
	t.Parallel()
	img := buildImage(t)
	t.Run("Metadata", func(t *testing.T) { t.Parallel(); imageMetadata(t, img) })
	t.Run("MigrateFailoverStop", func(t *testing.T) { t.Parallel(); imageMigrateFailoverStop(t, img) })
	t.Run("RollingReplacement", func(t *testing.T) { t.Parallel(); imageRollingReplacement(t, img) })
}

// imageMetadata: the labels carry the version and commit the binary was
// stamped with (make deb's), the default command is `wlproj run` as a
// numeric non-root user, the health check is the probe, and the image is
// small.
func imageMetadata(t *testing.T, img image) {
	out, err := img.podman("image", "inspect", img.ref).Output()
	require.NoError(t, err)
	var inspect []struct {
		Size   int64
		Config struct {
			User       string
			Entrypoint []string
			Cmd        []string
			Labels     map[string]string
			StopSignal string
		}
		HealthCheck struct{ Test []string }
	}
	require.NoError(t, json.Unmarshal(out, &inspect))
	require.Len(t, inspect, 1)
	meta := inspect[0]
	t.Logf("image %s: %d bytes (%.1f MiB)", img.ref, meta.Size, float64(meta.Size)/(1<<20))
	require.Less(t, meta.Size, int64(imageMaxBytes))
	require.Equal(t, imageUser, meta.Config.User)
	require.Equal(t, []string{"/usr/bin/wlproj", "run"}, slices.Concat(meta.Config.Entrypoint, meta.Config.Cmd))
	require.Equal(t, "SIGTERM", meta.Config.StopSignal)
	require.Equal(t, []string{"CMD", "/usr/libexec/wlproj/healthcheck", "${OUTBOX_HTTP_ADDR:-127.0.0.1}",
		"${OUTBOX_HTTP_PORT:-8080}", "/healthz"}, meta.HealthCheck.Test)

	out, err = img.oneOff(nil, "version", "--json")
	require.NoError(t, err, "%s", out)
	var build struct{ Version, Revision string }
	require.NoError(t, json.Unmarshal(out, &build), "%s", out)
	head, err := exec.Command("git", "-C", harness.Root(t), "rev-parse", "HEAD").Output()
	require.NoError(t, err)
	require.Equal(t, strings.TrimSpace(string(head)), build.Revision, "the binary is stamped with the checkout's commit")
	require.Equal(t, build.Version, meta.Config.Labels["org.opencontainers.image.version"])
	require.Equal(t, build.Revision, meta.Config.Labels["org.opencontainers.image.revision"])
	require.NotContains(t, []string{"", "unknown"}, meta.Config.Labels["org.opencontainers.image.created"])
	require.FileExists(t, img.archive)
}

// imageMigrateFailoverStop: the image migrates an empty database as a
// one-off container; two containers of it drain a workload; podman kill -s
// KILL of the leader hands over within the usual bound; podman stop of a
// leader with bulks in flight drains, exits 0 well within the stop
// timeout and leaves nothing in processing. Nothing is lost.
func imageMigrateFailoverStop(t *testing.T, img image) {
	db := harness.NewEmptyDatabase(t)
	out, err := img.oneOff([]string{"DATABASE_URL=" + db.URL, "MIGRATE_EXPECT_DB=" + db.Name}, "migrate")
	require.NoError(t, err, "wlproj migrate in a container:\n%s", out)
	reference := harness.NewDatabase(t)
	const schema = `SELECT max(version_id)::int FROM goose_db_version WHERE is_applied`
	require.Equal(t, reference.Int(t, schema), db.Int(t, schema), "the image's migrate applies every migration")

	c, cs := imageCluster(t, img, db)
	cs.start(c, "a")
	cs.start(c, "b")
	l := c.leader()
	for _, r := range c.replicas {
		out, err := img.podman("healthcheck", "run", cs.name(r.Name)).CombinedOutput()
		require.NoError(t, err, "the image's health check of %s:\n%s", r.Name, out)
	}
	c.slowBulks()
	c.produce(1000, 3)
	require.Less(t, c.midStream(l, 500), 3000.0, "the kill comes mid-stream")

	epoch := int64(c.db.Int(t, `SELECT epoch FROM outbox_leader`))
	killed, err := harness.Now(context.Background(), c.db.Pool)
	require.NoError(t, err)
	cs.kill(l)
	c.proxy.Clear() // the takeover measured at the engine's own speed
	next, _, err := harness.WaitLeader(context.Background(), takeoverBound, epoch+1, c.replicas...)
	require.NoError(t, err)
	ack, err := harness.WaitFirstAck(context.Background(), takeoverBound, c.db.Pool, killed, next.Name)
	require.NoError(t, err, "the new leader's first ack")
	takeover := ack.Sub(killed)
	t.Logf("podman kill -s KILL of %s: %s led and acked %.3f s after the kill", l.Name, next.Name, takeover.Seconds())
	require.Less(t, takeover, takeoverBound)
	c.settle(60 * time.Second)

	cs.start(c, "a2")
	c.proxy.Set(faultproxy.Fault{Delay: 300 * time.Millisecond}) // keep bulks in flight
	c.produce(1000, 2)
	harness.Eventually(t, 20*time.Second, "leader has work in flight", func() bool {
		return c.count(`status = 'processing' AND locked_by = '`+next.Name+`'`) > 0
	})
	took, code := cs.stop(next)
	t.Logf("podman stop of leader %s: exit %d after %.3f s", next.Name, code, took.Seconds())
	require.Zero(t, code, "the drained replica exits 0")
	require.Less(t, took, imageStopTimeout/2, "the drain ends well within the stop timeout")
	require.Zero(t, c.count(`status = 'processing' AND locked_by = '`+next.Name+`'`), "it leaves nothing in processing")
	c.proxy.Clear()
	require.NotEqual(t, next.Name, c.leader().Name)
	t.Logf("verdict: %s", c.settle(60*time.Second))
}

// imageRollingReplacement replaces both containers one at a time, as a
// Kubernetes rolling update with maxUnavailable 0 does, under a steady
// producer, with bulks slowed so that a stopped leader has some in flight:
// start a new container, wait until it is ready, stop the oldest one.
// Nothing is lost, regressed or resurrected.
func imageRollingReplacement(t *testing.T, img image) {
	c, cs := imageCluster(t, img, harness.NewDatabase(t))
	olds := []*harness.Replica{cs.start(c, "a"), cs.start(c, "b")}
	c.leader()
	c.proxy.Set(faultproxy.Fault{Delay: 100 * time.Millisecond}) // a stopped leader has bulks in flight
	producer := harness.Produce(context.Background(), c.db.Pool, harness.ProducerConfig{Rate: 200, Next: bookVersions(300)})
	t.Cleanup(producer.Stop)

	for i, old := range olds {
		midStream(t, c)
		fresh := cs.start(c, "new-"+strconv.Itoa(i+1))
		opWaitReady(t, fresh, http.StatusOK, 20*time.Second)
		h, err := old.Health()
		require.NoError(t, err)
		took, code := cs.stop(old)
		t.Logf("replaced %s by %s: %s (%s) stopped with exit %d after %.3f s", old.Name, fresh.Name, old.Name, h.Role, code, took.Seconds())
		require.Zero(t, code)
	}
	midStream(t, c)
	producer.Stop()
	c.proxy.Clear()
	require.Zero(t, producer.FailedInserts(), "the producer wrote every event: %v", producer.Err())
	l := c.leader()
	require.True(t, strings.HasPrefix(l.Name, "new-"), "a new container leads")
	v := c.settle(60 * time.Second)
	t.Logf("verdict after the rolling replacement: %s (%d events produced)", v, producer.Committed())
	require.EqualValues(t, producer.Committed(), v.Events)
}

// midStream waits for an ack after now: a leader is draining the
// producer's events.
func midStream(t *testing.T, c *cluster) {
	t.Helper()
	now, err := harness.Now(context.Background(), c.db.Pool)
	require.NoError(t, err)
	_, err = harness.WaitFirstAck(context.Background(), takeoverBound, c.db.Pool, now, "")
	require.NoError(t, err, "a leader acks the producer's events")
}

// bookVersions is a producer's Next: upserts of books in turn, each at a
// version above every earlier one.
func bookVersions(books int) func(n int) []harness.Event {
	var version int64
	return func(n int) []harness.Event {
		events := make([]harness.Event, n)
		for i := range events {
			version++
			id := strconv.FormatInt(version%int64(books), 10)
			events[i] = harness.Event{EntityType: "book", EntityID: id, Op: "upsert", Version: version, ScopeKey: "lib-1",
				Payload: json.RawMessage(fmt.Sprintf(`{"kind": "book", "title": "Book %s v%d", "position": %d}`, id, version, version))}
		}
		return events
	}
}

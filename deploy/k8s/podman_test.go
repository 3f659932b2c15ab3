package k8s

// The replicas' pod, as Kubernetes would run it, under podman: the image
// `make image` builds, the container's args, its environment from the
// generated ConfigMap and the Secrets, and its volumes (the projections
// ConfigMap of two search projections with their mapping files, the
// projections' and the console's Secrets, the CA bundle) as read-only
// mounts at the same paths, with the pod's user, read-only root and no
// capabilities. It needs podman and the test stack (make stack-up): `make
// test` runs it; WLPROJ_TEST_IMAGE names an image already built, to skip
// the build (about 100 s cold).

import (
	"context"
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
	"golang.org/x/crypto/bcrypt"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// podmanConf is the project's containers.conf (host networking, no
// default ulimits), as e2e's image tests use it.
const podmanConf = "../image/containers.conf"

func podman(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	conf, err := filepath.Abs(podmanConf)
	require.NoError(t, err)
	cmd := exec.Command("podman", args...)
	cmd.Env = append(os.Environ(), "CONTAINERS_CONF="+conf)
	return cmd
}

// testImage is WLPROJ_TEST_IMAGE, or an image `make image` builds from
// the checkout under a tag of the test's own, removed when it ends.
func testImage(t *testing.T) string {
	t.Helper()
	_, err := exec.LookPath("podman")
	require.NoError(t, err, "podman is not installed: run scripts/tools.sh (as root) to install it")
	if ref := os.Getenv("WLPROJ_TEST_IMAGE"); ref != "" {
		return ref
	}
	ref := "localhost/" + harness.UniqueName("wlproj-k8s-t-") + ":test"
	build := exec.Command("make", "--no-print-directory", "image", "IMAGE="+ref, "IMAGE_DIR="+t.TempDir())
	build.Dir = harness.Root(t)
	out, err := build.CombinedOutput()
	require.NoError(t, err, "make image:\n%s", out)
	t.Cleanup(func() { _ = podman(t, "rmi", "--force", ref).Run() })
	return ref
}

// podFiles writes the files of one volume into a directory of its own,
// readable by the pod's user: a ConfigMap of the build, the CA bundle
// (the host's, standing for the operator's), or a Secret with the
// example's values but where secrets overrides a key.
func podFiles(t *testing.T, m manifests, v corev1.Volume, secrets map[string]string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), v.Name)
	require.NoError(t, os.Mkdir(dir, 0o755))
	data := map[string]string{}
	var items []corev1.KeyToPath
	switch {
	case v.ConfigMap != nil && v.ConfigMap.Name == caBundle:
		b, err := os.ReadFile("/etc/ssl/certs/ca-certificates.crt")
		require.NoError(t, err)
		data["ca.crt"], items = string(b), v.ConfigMap.Items
	case v.ConfigMap != nil:
		data, items = m.full.configMaps[v.ConfigMap.Name].Data, v.ConfigMap.Items
	case v.Secret != nil:
		for k, val := range m.secrets[v.Secret.SecretName].StringData {
			data[k] = cmpOr(secrets[k], val)
		}
		items = v.Secret.Items
	}
	if len(items) == 0 {
		for k := range data {
			items = append(items, corev1.KeyToPath{Key: k, Path: k})
		}
	}
	for _, item := range items {
		require.NoError(t, os.WriteFile(filepath.Join(dir, item.Path), []byte(data[item.Key]), 0o444))
	}
	return dir
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// projectionsOnStack rewrites the projections file for the test stack:
// every engine's URLs become the stack's engine, every alias one of the
// test's own; the rest (credentials by reference, mapping files) stays.
// It returns the file and each projection's alias.
func projectionsOnStack(t *testing.T, file, engineURL string) (string, map[string]string) {
	t.Helper()
	var doc struct {
		Projections map[string]map[string]any `json:"projections"`
	}
	require.NoError(t, yaml.UnmarshalStrict([]byte(file), &doc))
	aliases := map[string]string{}
	for name, p := range doc.Projections {
		if p["kind"] != "search" {
			continue
		}
		p["engine"].(map[string]any)["urls"] = []string{engineURL}
		aliases[name] = harness.UniqueName("wlproj-k8s-" + name + "-")
		p["index"] = aliases[name]
		t.Cleanup(func() { _ = harness.DeleteIndex(context.Background(), engineURL, aliases[name]+"*") })
	}
	b, err := yaml.Marshal(doc)
	require.NoError(t, err)
	return string(b), aliases
}

// podEnv is the container's environment as the kubelet would give it:
// the ConfigMap's and the literals, the example Secrets' values, the pod's
// name and its memory request in bytes.
func podEnv(t *testing.T, m manifests, c corev1.Container, podName string) map[string]string {
	t.Helper()
	env, _ := m.containerEnv(t, m.full, c)
	for _, from := range c.EnvFrom {
		if from.SecretRef != nil {
			for k, v := range m.secrets[from.SecretRef.Name].StringData {
				env[k] = v
			}
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
		case e.ValueFrom.SecretKeyRef != nil:
			env[e.Name] = m.secrets[e.ValueFrom.SecretKeyRef.Name].StringData[e.ValueFrom.SecretKeyRef.Key]
		case e.ValueFrom.FieldRef != nil:
			require.Equal(t, "metadata.name", e.ValueFrom.FieldRef.FieldPath)
			env[e.Name] = podName
		case e.ValueFrom.ResourceFieldRef != nil:
			q := c.Resources.Requests[corev1.ResourceName(strings.TrimPrefix(e.ValueFrom.ResourceFieldRef.Resource, "requests."))]
			env[e.Name] = strconv.FormatInt(q.Value(), 10)
		}
	}
	return env
}

// launcher writes a script that harness.Start runs as the binary ("$0
// run"): podman runs the image instead, with the pod's security settings,
// its volumes mounted read-only at their paths and env passed by name.
func launcher(t *testing.T, img, name string, spec corev1.PodSpec, mounts map[string]string, env []string) string {
	t.Helper()
	sc := spec.SecurityContext
	args := []string{"podman", "run", "--rm", "--name", name, "--network", "host", "--read-only", "--cap-drop", "all",
		"--security-opt", "no-new-privileges", "--no-healthcheck", "--stop-timeout", "45",
		"--user", fmt.Sprintf("%d:%d", *sc.RunAsUser, *sc.RunAsGroup)}
	for host, path := range mounts {
		args = append(args, "--volume", host+":"+path+":ro")
	}
	for _, kv := range append(env, "OUTBOX_WORKER_ID=", "OUTBOX_HTTP_PORT=", "OUTBOX_METRICS_PORT=") {
		args = append(args, "--env", kv[:strings.Index(kv, "=")])
	}
	script := filepath.Join(t.TempDir(), "wlproj-pod")
	body := "#!/bin/sh\nexec " + strings.Join(args, " ") + " " + img + " \"$@\"\n"
	require.NoError(t, os.WriteFile(script, []byte(body), 0o755))
	t.Cleanup(func() { _ = podman(t, "rm", "--force", "--time", "0", name).Run() })
	return script
}

// The replicas' pod with every component, under podman against the test
// stack: the projections file of two search projections comes from the
// mounted ConfigMap, each projection's credentials from the Secret, the
// console's files from its Secret; the replica leads, creates each alias
// behind an index made from its mapping file, and drains both
// projections' events, every one checked against the model.
func TestPodUnderPodman(t *testing.T) {
	m := load(t)
	img := testImage(t)
	spec := m.full.deployments[0].Spec.Template.Spec
	c := only(t, spec)
	require.Equal(t, []string{"run"}, c.Args)
	engine := harness.ElasticURL(t)
	db := harness.NewDatabase(t)

	podName := harness.UniqueName("wlproj-k8s-pod-")
	env := podEnv(t, m, c, podName)
	cm := mountedConfigMap(t, m.full, spec, filepath.Dir(env["OUTBOX_PROJECTIONS_FILE"]))
	file, aliases := projectionsOnStack(t, cm.Data[filepath.Base(env["OUTBOX_PROJECTIONS_FILE"])], engine)
	require.Len(t, aliases, 2, "two search projections")
	cm.Data[filepath.Base(env["OUTBOX_PROJECTIONS_FILE"])] = file
	hash, err := bcryptHash("secret")
	require.NoError(t, err)
	secrets := map[string]string{"htpasswd": "alice:" + hash + "\n", "session.key": strings.Repeat("k", 32)}
	mounts := map[string]string{}
	for _, vm := range c.VolumeMounts {
		v := spec.Volumes[slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == vm.Name })]
		mounts[podFiles(t, m, v, secrets)] = vm.MountPath
	}
	// What cannot work here: the stack's database, loopback, free ports.
	env["DATABASE_URL"] = db.URL
	env["OUTBOX_HTTP_ADDR"] = "127.0.0.1"
	env["OUTBOX_CONSOLE_PORT"] = strconv.Itoa(harness.Port(t))
	var list []string
	for k, v := range env {
		list = append(list, k+"="+v)
	}
	conf, err := filepath.Abs(podmanConf)
	require.NoError(t, err)
	r, err := harness.Start(launcher(t, img, podName, spec, mounts, list), podName, append(list, "CONTAINERS_CONF="+conf), nil)
	require.NoError(t, err)
	t.Cleanup(func() {
		r.Stop(45 * time.Second)
		if t.Failed() {
			logs := r.Logs()
			t.Logf("logs of the pod:\n%s", logs[max(0, len(logs)-6000):])
		}
	})
	harness.Healthy(t, r)
	require.NoError(t, r.WaitRole(context.Background(), 30*time.Second, "leader"))
	resp, err := http.Get("http://127.0.0.1:" + env["OUTBOX_CONSOLE_PORT"] + "/console/")
	require.NoError(t, err, "the console component's port")
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	db.Exec(t, `INSERT INTO outbox_events (projection, entity_type, entity_id, op, event_version, payload)
		SELECT 'books', 'book', e::text, 'upsert', v, jsonb_build_object('title', 'Book ' || e || ' v' || v, 'isbn', 'i-' || e)
		  FROM generate_series(1, 40) e, generate_series(1, 3) v ORDER BY random()`)
	db.Exec(t, `INSERT INTO outbox_events (projection, entity_type, entity_id, op, event_version, payload)
		SELECT 'authors', 'author', e::text, 'upsert', 1, jsonb_build_object('name', 'Author ' || e, 'born', '1900-01-01')
		  FROM generate_series(1, 25) e`)
	harness.Drained(t, db.Pool, 60*time.Second)
	for name, want := range map[string]int{"books": 40, "authors": 25} {
		harness.VerifiedProjection(t, db.Pool, aliases[name], name)
		n, err := harness.DocCount(context.Background(), engine, aliases[name])
		require.NoError(t, err)
		require.Equal(t, want, n, "%s's alias %s holds its documents", name, aliases[name])
	}
	types, err := harness.MappedTypes(context.Background(), engine, aliases["books"], "isbn")
	require.NoError(t, err)
	require.Len(t, types, 1, "one index behind the alias")
	for index, typ := range types {
		require.NotEqual(t, aliases["books"], index, "an alias, not a concrete index of its name")
		require.Equal(t, "keyword", typ, "the mapping file's type, not a dynamic one")
	}
}

// mountedConfigMap is the build's ConfigMap mounted at dir.
func mountedConfigMap(t *testing.T, o objects, spec corev1.PodSpec, dir string) *corev1.ConfigMap {
	t.Helper()
	c := only(t, spec)
	i := slices.IndexFunc(c.VolumeMounts, func(vm corev1.VolumeMount) bool { return vm.MountPath == dir })
	require.NotEqual(t, -1, i, "nothing is mounted at %s", dir)
	v := spec.Volumes[slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == c.VolumeMounts[i].Name })]
	require.NotNil(t, v.ConfigMap)
	return o.configMaps[v.ConfigMap.Name]
}

func bcryptHash(password string) (string, error) {
	b, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
	return string(b), err
}

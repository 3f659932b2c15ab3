package k8s

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"golang.org/x/crypto/bcrypt"

	"github.com/wlproj/wlproj/cli"
	"github.com/wlproj/wlproj/internal/testkit/harness"
)

const (
	// drainMargin is how much longer than OUTBOX_SHUTDOWN_GRACE_SECONDS a
	// leader's services may take to drain before it releases the lock
	// (replica's drainTimeoutMargin, unexported there).
	drainMargin = 10 * time.Second
	// staleAfter is how long the replica's loop may go without a tick
	// before /healthz fails (health's staleAfterDefault).
	staleAfter = 10 * time.Second
	// readyCheckTimeout bounds /readyz's own checks (health's
	// checkTimeoutDefault): a readiness probe must wait longer.
	readyCheckTimeout = 2 * time.Second

	secretsExample = "secrets.example.yaml"
	containerfile  = "../image/Containerfile"
	runbookSection = "## Containers and Kubernetes"
)

// kinds are the Go types of every kind the manifests may hold, by
// apiVersion/kind; any other kind fails the decode.
var kinds = map[string]func() any{
	"apps/v1/Deployment":                            func() any { return &appsv1.Deployment{} },
	"batch/v1/Job":                                  func() any { return &batchv1.Job{} },
	"v1/ConfigMap":                                  func() any { return &corev1.ConfigMap{} },
	"v1/Secret":                                     func() any { return &corev1.Secret{} },
	"v1/ServiceAccount":                             func() any { return &corev1.ServiceAccount{} },
	"policy/v1/PodDisruptionBudget":                 func() any { return &policyv1.PodDisruptionBudget{} },
	"networking.k8s.io/v1/NetworkPolicy":            func() any { return &networkingv1.NetworkPolicy{} },
	"kustomize.config.k8s.io/v1beta1/Kustomization": func() any { return &types.Kustomization{} },
	"kustomize.config.k8s.io/v1alpha1/Component":    func() any { return &types.Kustomization{} },
}

// decodeStrict decodes one YAML document into the Go type of its
// apiVersion and kind. An unknown kind, an unknown or misspelt field and a
// field given twice all fail.
func decodeStrict(doc []byte) (any, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return nil, err
	}
	newObject, ok := kinds[tm.APIVersion+"/"+tm.Kind]
	if !ok {
		return nil, fmt.Errorf("unknown kind %q of apiVersion %q", tm.Kind, tm.APIVersion)
	}
	obj := newObject()
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return nil, fmt.Errorf("%s: %w", tm.Kind, err)
	}
	return obj, nil
}

// decodeAll decodes every document of a YAML stream strictly.
func decodeAll(t *testing.T, where string, stream []byte) []any {
	t.Helper()
	r := k8syaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(stream)))
	var objs []any
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, where)
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, err := decodeStrict(doc)
		require.NoError(t, err, "%s:\n%s", where, doc)
		objs = append(objs, obj)
	}
	require.NotEmpty(t, objs, "%s holds no manifest", where)
	return objs
}

// objects are the decoded manifests of one build or file.
type objects struct {
	deployments []*appsv1.Deployment
	jobs        []*batchv1.Job
	configMaps  map[string]*corev1.ConfigMap
	secrets     map[string]*corev1.Secret
	pdbs        []*policyv1.PodDisruptionBudget
	accounts    []*corev1.ServiceAccount
	policies    []*networkingv1.NetworkPolicy
}

func sortObjects(t *testing.T, decoded []any) objects {
	t.Helper()
	o := objects{configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{}}
	for _, obj := range decoded {
		switch obj := obj.(type) {
		case *appsv1.Deployment:
			o.deployments = append(o.deployments, obj)
		case *batchv1.Job:
			o.jobs = append(o.jobs, obj)
		case *corev1.ConfigMap:
			o.configMaps[obj.Name] = obj
		case *corev1.Secret:
			o.secrets[obj.Name] = obj
		case *policyv1.PodDisruptionBudget:
			o.pdbs = append(o.pdbs, obj)
		case *corev1.ServiceAccount:
			o.accounts = append(o.accounts, obj)
		case *networkingv1.NetworkPolicy:
			o.policies = append(o.policies, obj)
		default:
			t.Fatalf("a build holds a %T", obj)
		}
	}
	return o
}

// build runs kustomize on dir, as `kubectl apply -k dir` does, and decodes
// what it makes.
func build(t *testing.T, dir string) objects {
	t.Helper()
	return sortObjects(t, decodeAll(t, "kustomize build "+dir, render(t, dir)))
}

// render is kustomize's YAML of dir.
func render(t *testing.T, dir string) []byte {
	t.Helper()
	resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	require.NoError(t, err, "kustomize build %s", dir)
	out, err := resources.AsYaml()
	require.NoError(t, err)
	return out
}

// components are the directories of deploy/k8s an install may add.
var components = []string{"projections", "console", "tls", "networkpolicy"}

// overlay writes an install of its own outside deploy/k8s, as the runbook
// shows one: the replicas, the migration Job and every component, in the
// namespace wlproj. It returns its directory.
func overlay(t *testing.T, k8s string) string {
	t.Helper()
	here, err := filepath.Abs(k8s)
	require.NoError(t, err)
	dir := t.TempDir()
	rel, err := filepath.Rel(dir, here)
	require.NoError(t, err)
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: wlproj\nresources:\n" +
		"  - " + rel + "\n  - " + rel + "/migrate\ncomponents:\n"
	for _, c := range components {
		k += "  - " + rel + "/" + c + "\n"
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o600))
	return dir
}

// manifests are the replicas' build, the migration's build, an install
// with everything on (full) and the example Secrets.
type manifests struct {
	replicas, migrate, full objects
	secrets                 map[string]*corev1.Secret
}

func load(t *testing.T) manifests {
	t.Helper()
	b, err := os.ReadFile(secretsExample)
	require.NoError(t, err)
	m := manifests{replicas: build(t, "."), migrate: build(t, "migrate"), full: build(t, overlay(t, ".")),
		secrets: sortObjects(t, decodeAll(t, secretsExample, b)).secrets}
	require.Len(t, m.replicas.deployments, 1)
	require.Len(t, m.replicas.pdbs, 1)
	require.Empty(t, m.replicas.jobs, "the migration Job is applied on its own, before the rollout")
	require.Len(t, m.migrate.jobs, 1)
	require.Empty(t, m.migrate.deployments)
	require.Len(t, m.full.deployments, 1)
	require.Len(t, m.full.jobs, 1)
	require.Len(t, m.full.policies, 1)
	return m
}

func (m manifests) deployment() *appsv1.Deployment { return m.replicas.deployments[0] }
func (m manifests) job() *batchv1.Job              { return m.migrate.jobs[0] }

// only is the one container of a pod template.
func only(t *testing.T, spec corev1.PodSpec) corev1.Container {
	t.Helper()
	require.Len(t, spec.Containers, 1, "one process per pod")
	require.Empty(t, spec.InitContainers)
	return spec.Containers[0]
}

// Every file of the directory, as written, and both builds decode strictly
// into the Kubernetes API's own types; the decoder refuses a misspelt field,
// so this cannot pass by accident.
func TestManifestsDecodeStrictly(t *testing.T) {
	files, err := filepath.Glob("*.yaml")
	require.NoError(t, err)
	more, err := filepath.Glob("*/*.yaml")
	require.NoError(t, err)
	files = append(files, more...)
	require.GreaterOrEqual(t, len(files), 9)
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		decodeAll(t, f, b)
	}
	load(t)

	for _, bad := range []string{
		"apiVersion: apps/v1\nkind: Deployment\nspec:\n  replicass: 2\n",
		"apiVersion: v1\nkind: ConfigMap\ndata: {A: b}\ndata: {A: c}\n",
		"apiVersion: v1\nkind: Service\n",
		"apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresource: [a.yaml]\n",
	} {
		_, err := decodeStrict([]byte(bad))
		require.Error(t, err, "the strict decoder accepted:\n%s", bad)
	}
}

// commandEnv is every variable `wlproj <command>` reads through a flag,
// with the flag: the root's and the command's own, from the CLI's kong
// model (what `wlproj <command> --help` prints).
func commandEnv(t *testing.T, command string) map[string]*kong.Flag {
	t.Helper()
	model, err := cli.Model()
	require.NoError(t, err)
	env := map[string]*kong.Flag{}
	add := func(n *kong.Node) {
		for _, f := range n.Flags {
			for _, e := range f.Envs {
				env[e] = f
			}
		}
	}
	add(model.Node)
	i := slices.IndexFunc(model.Node.Children, func(n *kong.Node) bool { return n.Name == command })
	require.NotEqual(t, -1, i, "wlproj has no command %q", command)
	add(model.Node.Children[i])
	return env
}

// containerEnv is every variable the container gets, by name, with the
// value the manifests give it: a ConfigMap's or a literal's, empty for a
// Secret's or a field's. Each Secret and key it names must be in the
// example; it returns the Secrets it read.
func (m manifests) containerEnv(t *testing.T, o objects, c corev1.Container) (map[string]string, []string) {
	t.Helper()
	env := map[string]string{}
	var secrets []string
	secret := func(name string) *corev1.Secret {
		s, ok := m.secrets[name]
		require.True(t, ok, "%s reads Secret %s, which %s does not show", c.Name, name, secretsExample)
		secrets = append(secrets, name)
		return s
	}
	for _, from := range c.EnvFrom {
		require.Empty(t, from.Prefix, "%s: no prefixed variables", c.Name)
		switch {
		case from.ConfigMapRef != nil:
			cm, ok := o.configMaps[from.ConfigMapRef.Name]
			require.True(t, ok, "%s reads ConfigMap %s, which its build does not make", c.Name, from.ConfigMapRef.Name)
			for k, v := range cm.Data {
				env[k] = v
			}
		case from.SecretRef != nil:
			for k := range secret(from.SecretRef.Name).StringData {
				env[k] = ""
			}
		}
	}
	for _, e := range c.Env {
		env[e.Name] = e.Value
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			ref := e.ValueFrom.SecretKeyRef
			require.Contains(t, secret(ref.Name).StringData, ref.Key, "%s: %s from Secret %s", c.Name, e.Name, ref.Name)
		}
	}
	return env, secrets
}

// otherEnv are the variables a container may get that are no flag of
// wlproj's: each is read by what the comment says.
var otherEnv = map[string]string{
	"GOMEMLIMIT":    "Go's runtime: the soft memory limit",
	"GOGC":          "Go's runtime; wlproj run sets 400 unless it is given",
	"PGSSLROOTCERT": "pgx, as libpq: the root certificates for sslmode=verify-full",
}

// pod is one container of a build, with the command it runs.
type pod struct {
	what    string
	o       objects
	spec    corev1.PodSpec
	command string
}

// pods are every pod template of every build.
func (m manifests) pods() []pod {
	return []pod{
		{"replicas", m.replicas, m.deployment().Spec.Template.Spec, "run"},
		{"migrate", m.migrate, m.job().Spec.Template.Spec, "migrate"},
		{"full replicas", m.full, m.full.deployments[0].Spec.Template.Spec, "run"},
		{"full migrate", m.full, m.full.jobs[0].Spec.Template.Spec, "migrate"},
	}
}

// Every variable the manifests give a container is one its wlproj command
// reads (or Go's runtime, pgx, or the projections file's password_env and
// api_key_env), every Secret they read is in the example with the keys
// they read, every ConfigMap is one of the build's (or the CA bundle the
// operator makes), and every Secret of the example is read.
func TestManifestsEnvironmentIsTheBinarys(t *testing.T) {
	m := load(t)
	read := map[string]bool{}
	for _, p := range m.pods() {
		c := only(t, p.spec)
		require.Empty(t, c.Command, "the image's entrypoint runs /usr/bin/wlproj")
		require.Equal(t, []string{p.command}, c.Args)
		known := commandEnv(t, p.command)
		env, secrets := m.containerEnv(t, p.o, c)
		byFile := projectionsFileEnv(t, p.o, p.spec, env)
		for name := range env {
			_, other := otherEnv[name]
			require.True(t, known[name] != nil || other || byFile[name],
				"%s: %s is not a variable of `wlproj %s`", p.what, name, p.command)
		}
		for name := range byFile {
			require.Contains(t, env, name, "%s: the projections file names %s, which the container does not get", p.what, name)
		}
		require.Contains(t, env, "DATABASE_URL")
		secrets = append(secrets, m.volumeSecrets(t, p)...)
		for _, s := range secrets {
			read[s] = true
		}
	}
	for name := range m.secrets {
		require.True(t, read[name], "%s shows Secret %s, which no manifest reads", secretsExample, name)
	}
}

// caBundle is the ConfigMap of the tls component, which the operator (or
// trust-manager) makes.
const caBundle = "wlproj-ca"

// volumeSecrets checks the pod's volumes: each Secret, with the keys it
// lists, is in the example; each ConfigMap is in the build, with the keys
// it lists, but the CA bundle. It returns the Secrets.
func (m manifests) volumeSecrets(t *testing.T, p pod) []string {
	t.Helper()
	var secrets []string
	for _, v := range p.spec.Volumes {
		switch {
		case v.Secret != nil:
			s, ok := m.secrets[v.Secret.SecretName]
			require.True(t, ok, "%s mounts Secret %s, which %s does not show", p.what, v.Secret.SecretName, secretsExample)
			for _, item := range v.Secret.Items {
				require.Contains(t, s.StringData, item.Key, "%s: Secret %s", p.what, s.Name)
			}
			secrets = append(secrets, s.Name)
		case v.ConfigMap != nil && v.ConfigMap.Name == caBundle:
		case v.ConfigMap != nil:
			cm, ok := p.o.configMaps[v.ConfigMap.Name]
			require.True(t, ok, "%s mounts ConfigMap %s, which its build does not make (an overlay without namespace: wlproj?)", p.what, v.ConfigMap.Name)
			for _, item := range v.ConfigMap.Items {
				require.Contains(t, cm.Data, item.Key)
			}
		default:
			t.Fatalf("%s: volume %s is neither a Secret nor a ConfigMap", p.what, v.Name)
		}
	}
	return secrets
}

// mounted is the content of the file at path in the container, from the
// build's ConfigMap mounted there; ok is false when no ConfigMap of the
// build is mounted at its directory.
func mounted(t *testing.T, o objects, spec corev1.PodSpec, path string) (content string, ok bool) {
	t.Helper()
	c := only(t, spec)
	for _, vm := range c.VolumeMounts {
		if filepath.Dir(path) != vm.MountPath {
			continue
		}
		require.True(t, vm.ReadOnly, "%s is mounted read-only", vm.MountPath)
		v := spec.Volumes[slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == vm.Name })]
		if v.ConfigMap == nil {
			return "", false
		}
		cm, found := o.configMaps[v.ConfigMap.Name]
		require.True(t, found, "ConfigMap %s", v.ConfigMap.Name)
		content, ok = cm.Data[filepath.Base(path)]
		return content, ok
	}
	return "", false
}

var reSecretEnv = regexp.MustCompile(`(?m)^\s*(?:password|api_key)_env:\s*(\S+)`)

// projectionsFileEnv are the variables the container's projections file
// names with password_env or api_key_env; none without a file. The file
// must be mounted from a ConfigMap of the build.
func projectionsFileEnv(t *testing.T, o objects, spec corev1.PodSpec, env map[string]string) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	path, set := env["OUTBOX_PROJECTIONS_FILE"]
	if !set {
		return names
	}
	file, ok := mounted(t, o, spec, path)
	require.True(t, ok, "OUTBOX_PROJECTIONS_FILE=%s: no ConfigMap of the build is mounted there", path)
	for _, m := range reSecretEnv.FindAllStringSubmatch(file, -1) {
		names[m[1]] = true
	}
	return names
}

// setting is the value of a `wlproj run` variable in the replicas'
// environment, or the binary's default.
func setting(env map[string]string, flags map[string]*kong.Flag, name string) string {
	if v, ok := env[name]; ok {
		return v
	}
	return flags[name].Default
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	require.NoError(t, err)
	return n
}

// The probes ask the replica's own port for the paths it serves, with
// thresholds that neither fail a standby waiting for the lock nor kill a
// leader in its longest drain, and the pod is given longer than that drain.
func TestManifestsProbesPortsAndGrace(t *testing.T) {
	m := load(t)
	d := m.deployment()
	spec := d.Spec.Template.Spec
	c := only(t, spec)
	env, _ := m.containerEnv(t, m.replicas, c)
	flags := commandEnv(t, "run")

	require.Equal(t, "0.0.0.0", setting(env, flags, "OUTBOX_HTTP_ADDR"), "the kubelet probes the pod's IP")
	httpPort := atoi(t, setting(env, flags, "OUTBOX_HTTP_PORT"))
	require.Len(t, c.Ports, 1, "health and metrics share one port; the console stays on loopback")
	require.Equal(t, "http", c.Ports[0].Name)
	require.EqualValues(t, httpPort, c.Ports[0].ContainerPort)
	metricsPort := atoi(t, setting(env, flags, "OUTBOX_METRICS_PORT"))
	if metricsPort == 0 {
		metricsPort = httpPort
	}
	ann := d.Spec.Template.Annotations
	require.Equal(t, "true", ann["prometheus.io/scrape"])
	require.Equal(t, strconv.Itoa(metricsPort), ann["prometheus.io/port"])
	require.Equal(t, "/metrics", ann["prometheus.io/path"])
	// With the console component: a port of its own, on loopback.
	full, _ := m.containerEnv(t, m.full, only(t, m.full.deployments[0].Spec.Template.Spec))
	require.NotEmpty(t, full["OUTBOX_CONSOLE_USERS_FILE"])
	console := atoi(t, full["OUTBOX_CONSOLE_PORT"])
	require.NotZero(t, console)
	require.NotEqual(t, httpPort, console, "the console has a port of its own")
	require.Equal(t, "127.0.0.1", full["OUTBOX_CONSOLE_ADDR"], "the console is reached with kubectl port-forward")

	ready, live := c.ReadinessProbe, c.LivenessProbe
	require.NotNil(t, ready)
	require.NotNil(t, live)
	require.Nil(t, c.StartupProbe)
	for _, p := range []*corev1.Probe{ready, live} {
		require.NotNil(t, p.HTTPGet)
		require.Equal(t, intstr.FromString("http"), p.HTTPGet.Port)
	}
	require.Equal(t, "/readyz", ready.HTTPGet.Path)
	require.Equal(t, "/healthz", live.HTTPGet.Path)
	require.Greater(t, seconds(ready.TimeoutSeconds), readyCheckTimeout, "/readyz bounds its own checks first")

	grace := seconds(*spec.TerminationGracePeriodSeconds)
	shutdown, err := strconv.ParseFloat(setting(env, flags, "OUTBOX_SHUTDOWN_GRACE_SECONDS"), 64)
	require.NoError(t, err)
	drain := time.Duration(shutdown*float64(time.Second)) + drainMargin
	require.Greater(t, grace, drain, "the kubelet must not SIGKILL a leader mid-drain")
	// /healthz fails after staleAfter without a tick; a leader ticks through
	// its drain and a standby while it waits for the lock. Even so, a
	// minute of failures is needed before a restart: more than the drain.
	liveWindow := seconds(live.PeriodSeconds * live.FailureThreshold)
	require.Greater(t, liveWindow, staleAfter)
	require.GreaterOrEqual(t, liveWindow, grace)
}

func seconds[N int32 | int64](s N) time.Duration { return time.Duration(s) * time.Second }

// A rolling update adds one ready replica before it stops an old one, a
// disruption leaves one ready, and the migration Job runs the image the
// rollout brings, as the schema's owner.
func TestManifestsRolloutNeverTakesBothDown(t *testing.T) {
	m := load(t)
	d := m.deployment()
	require.EqualValues(t, 2, *d.Spec.Replicas, "one leader, one standby")
	require.Equal(t, appsv1.RollingUpdateDeploymentStrategyType, d.Spec.Strategy.Type)
	require.Equal(t, intstr.FromInt32(0), *d.Spec.Strategy.RollingUpdate.MaxUnavailable)
	require.Equal(t, intstr.FromInt32(1), *d.Spec.Strategy.RollingUpdate.MaxSurge)
	require.Positive(t, d.Spec.MinReadySeconds, "a new replica stands by a moment before an old one stops")
	selector, err := metav1.LabelSelectorAsMap(d.Spec.Selector)
	require.NoError(t, err)
	for k, v := range selector {
		require.Equal(t, v, d.Spec.Template.Labels[k], "the selector matches the pods")
	}
	pdb := m.replicas.pdbs[0]
	require.Equal(t, intstr.FromInt32(1), *pdb.Spec.MinAvailable)
	require.Equal(t, d.Spec.Selector, pdb.Spec.Selector, "the budget covers the replicas")

	job := m.job()
	replica, migrate := only(t, d.Spec.Template.Spec), only(t, job.Spec.Template.Spec)
	require.Equal(t, replica.Image, migrate.Image, "the Job migrates to the schema of the binary the rollout brings")
	require.NotEqual(t, "wlproj", replica.Image, "version/ names the image")
	require.Equal(t, corev1.RestartPolicyNever, job.Spec.Template.Spec.RestartPolicy)
	databaseSecret := func(c corev1.Container) string {
		i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "DATABASE_URL" })
		require.NotEqual(t, -1, i)
		return c.Env[i].ValueFrom.SecretKeyRef.Name
	}
	require.NotEqual(t, databaseSecret(replica), databaseSecret(migrate), "the runtime role runs, the owner migrates")
	require.Equal(t, m.replicas.deployments[0].Namespace, job.Namespace)
}

// imageUser is the numeric user and group the image runs as.
func imageUser(t *testing.T) (uid, gid int64) {
	t.Helper()
	b, err := os.ReadFile(containerfile)
	require.NoError(t, err)
	u := regexp.MustCompile(`(?m)^USER (\d+):(\d+)$`).FindSubmatch(b)
	require.NotNil(t, u, "%s names no numeric USER", containerfile)
	uid, _ = strconv.ParseInt(string(u[1]), 10, 64)
	gid, _ = strconv.ParseInt(string(u[2]), 10, 64)
	return uid, gid
}

// Both pods run as the image's unprivileged user, with a read-only root,
// no capabilities, no privilege escalation and no API token.
func TestManifestsRunUnprivileged(t *testing.T) {
	m := load(t)
	uid, gid := imageUser(t)
	require.NotZero(t, uid)
	for _, spec := range []corev1.PodSpec{m.deployment().Spec.Template.Spec, m.job().Spec.Template.Spec} {
		pod := spec.SecurityContext
		require.NotNil(t, pod)
		require.Equal(t, ptrTo(true), pod.RunAsNonRoot)
		require.Equal(t, ptrTo(uid), pod.RunAsUser)
		require.Equal(t, ptrTo(gid), pod.RunAsGroup)
		require.Equal(t, corev1.SeccompProfileTypeRuntimeDefault, pod.SeccompProfile.Type)
		require.Equal(t, ptrTo(false), spec.AutomountServiceAccountToken)
		require.False(t, spec.HostNetwork || spec.HostPID || spec.HostIPC)
		c := only(t, spec).SecurityContext
		require.NotNil(t, c)
		require.Equal(t, ptrTo(true), c.ReadOnlyRootFilesystem)
		require.Equal(t, ptrTo(false), c.AllowPrivilegeEscalation)
		require.Nil(t, c.Privileged)
		require.Equal(t, []corev1.Capability{"ALL"}, c.Capabilities.Drop)
		require.Empty(t, c.Capabilities.Add)
	}
}

func ptrTo[T any](v T) *T { return &v }

// consoleFiles maps the console's file settings to the keys of the Secret
// mounted where they point.
func consoleFiles(t *testing.T, spec corev1.PodSpec, env map[string]string) map[string]string {
	t.Helper()
	c := only(t, spec)
	files := map[string]string{}
	for _, name := range []string{"OUTBOX_CONSOLE_USERS_FILE", "OUTBOX_CONSOLE_SESSION_KEY_FILE"} {
		path := env[name]
		i := slices.IndexFunc(c.VolumeMounts, func(vm corev1.VolumeMount) bool { return vm.MountPath == filepath.Dir(path) })
		require.NotEqual(t, -1, i, "%s=%s: nothing is mounted at %s", name, path, filepath.Dir(path))
		require.True(t, c.VolumeMounts[i].ReadOnly)
		v := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == c.VolumeMounts[i].Name })
		require.NotEqual(t, -1, v)
		require.NotNil(t, spec.Volumes[v].Secret, "%s comes from a Secret", name)
		files[name] = filepath.Base(path)
	}
	return files
}

// silentDatabase is a loopback address that accepts connections and never
// answers, as a database behind a cut network does: each connection
// attempt lasts until the client's own timeout.
func silentDatabase(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var held []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			_ = c.Close()
		}
	})
	return l.Addr().String()
}

// startReplica runs the real binary with env, on loopback.
func startReplica(t *testing.T, env map[string]string) *harness.Replica {
	t.Helper()
	env["OUTBOX_HTTP_ADDR"] = "127.0.0.1"
	var list []string
	for k, v := range env {
		list = append(list, k+"="+v)
	}
	r, err := harness.Start(harness.Binary(t), "k8s-check", list, nil)
	require.NoError(t, err)
	t.Cleanup(func() { r.Stop(10 * time.Second) })
	harness.Healthy(t, r)
	return r
}

// The real binary, given the replicas' settings, starts without any
// Secret but the database's (the console is off: no Secret of its) and
// serves the paths the probes and Prometheus ask for: /readyz 503 naming
// the database it cannot reach, /metrics its series, and /healthz 200 for
// longer than the loop's staleness limit while the database does not
// answer at all, as the runbook says: a database outage does not get the
// pods restarted. Only what cannot work here is replaced: the database (a
// listener that never answers) and the engine (a closed port), the
// addresses and ports (loopback, free ones).
func TestManifestsAgreeWithTheRunningBinary(t *testing.T) {
	m := load(t)
	spec := m.deployment().Spec.Template.Spec
	env, _ := m.containerEnv(t, m.replicas, only(t, spec))
	for name := range env {
		require.False(t, strings.HasPrefix(name, "OUTBOX_CONSOLE_"), "the console is off by default: %s", name)
	}
	require.Empty(t, spec.Volumes, "the base mounts no Secret: none but the database's needs to exist")
	env["DATABASE_URL"] = "postgres://wlproj@" + silentDatabase(t) + "/app?sslmode=disable"
	env["ELASTIC_URL"] = "http://127.0.0.1:" + strconv.Itoa(harness.Port(t))
	started := time.Now()
	r := startReplica(t, env)

	c := only(t, spec)
	code, body, err := r.Get(c.ReadinessProbe.HTTPGet.Path)
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, code, "%s", body)
	require.Contains(t, string(body), `"database":"unreachable`)
	code, body, err = r.Get(m.deployment().Spec.Template.Annotations["prometheus.io/path"])
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, string(body), "\noutbox_ready ")
	code, _, err = r.Get("/console/")
	require.NoError(t, err)
	require.Equal(t, http.StatusNotFound, code, "no console unless the component turns it on")

	for time.Since(started) < staleAfter+3*time.Second {
		code, body, err = r.Get(c.LivenessProbe.HTTPGet.Path)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, code, "%s after %s without a database", body, time.Since(started))
		time.Sleep(500 * time.Millisecond)
	}
}

// With the console component, the binary starts with its settings and
// serves the console on its own port, the Secret's files under the
// Secret's key names (a user and a key of the test's own).
func TestManifestsConsoleComponentStarts(t *testing.T) {
	m := load(t)
	spec := m.full.deployments[0].Spec.Template.Spec
	full, _ := m.containerEnv(t, m.full, only(t, spec))
	env, _ := m.containerEnv(t, m.replicas, only(t, m.deployment().Spec.Template.Spec))
	for name, v := range full {
		if strings.HasPrefix(name, "OUTBOX_CONSOLE_") {
			env[name] = v
		}
	}
	dir := t.TempDir()
	hash, err := bcrypt.GenerateFromPassword([]byte("secret"), bcrypt.MinCost)
	require.NoError(t, err)
	for name, key := range consoleFiles(t, spec, env) {
		env[name] = filepath.Join(dir, key)
	}
	require.NoError(t, os.WriteFile(env["OUTBOX_CONSOLE_USERS_FILE"], []byte("alice:"+string(hash)+"\n"), 0o600))
	require.NoError(t, os.WriteFile(env["OUTBOX_CONSOLE_SESSION_KEY_FILE"], bytes.Repeat([]byte("k"), 32), 0o600))
	closed := "127.0.0.1:" + strconv.Itoa(harness.Port(t))
	env["DATABASE_URL"] = "postgres://wlproj@" + closed + "/app?sslmode=disable"
	env["ELASTIC_URL"] = "http://" + closed
	env["OUTBOX_CONSOLE_PORT"] = strconv.Itoa(harness.Port(t))
	startReplica(t, env)
	resp, err := http.Get("http://127.0.0.1:" + env["OUTBOX_CONSOLE_PORT"] + "/console/")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// The Job's settings take `wlproj migrate` as far as connecting: it fails
// on the unreachable database (1), not on a value it cannot use (2), as it
// does once a value is broken.
func TestManifestsMigrateSettingsAreAccepted(t *testing.T) {
	m := load(t)
	env, _ := m.containerEnv(t, m.migrate, only(t, m.job().Spec.Template.Spec))
	env["DATABASE_URL"] = "postgres://wlproj@127.0.0.1:" + strconv.Itoa(harness.Port(t)) + "/app?sslmode=disable"
	migrate := func(env map[string]string) int {
		cmd := exec.Command(harness.Binary(t), "migrate")
		cmd.Env = os.Environ()
		for k, v := range env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "%s", out)
		return exit.ExitCode()
	}
	require.Equal(t, 1, migrate(env))
	env["MIGRATE_EXPECT_PORT"] = "fivefour"
	require.Equal(t, 2, migrate(env))
}

var reRunbookRow = regexp.MustCompile("(?m)^\\| `([a-zA-Z.]+)` \\| `([^`]+)` \\|")

func prefixed(prefix string, names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = prefix + n
	}
	return out
}

// runbookFacts is what the runbook's table of the manifests must say, as
// the manifests say it.
func runbookFacts(m manifests) map[string]string {
	d := m.deployment()
	c := d.Spec.Template.Spec.Containers[0]
	probe := func(p *corev1.Probe) string {
		return fmt.Sprintf("GET %s every %ds, timeout %ds, %d failures", p.HTTPGet.Path, p.PeriodSeconds, p.TimeoutSeconds, p.FailureThreshold)
	}
	return map[string]string{
		"replicas":                      strconv.Itoa(int(*d.Spec.Replicas)),
		"maxSurge":                      d.Spec.Strategy.RollingUpdate.MaxSurge.String(),
		"maxUnavailable":                d.Spec.Strategy.RollingUpdate.MaxUnavailable.String(),
		"minReadySeconds":               strconv.Itoa(int(d.Spec.MinReadySeconds)),
		"terminationGracePeriodSeconds": strconv.Itoa(int(*d.Spec.Template.Spec.TerminationGracePeriodSeconds)),
		"readinessProbe":                probe(c.ReadinessProbe),
		"livenessProbe":                 probe(c.LivenessProbe),
		"minAvailable":                  m.replicas.pdbs[0].Spec.MinAvailable.String(),
	}
}

// The runbook's section says what the manifests hold, and upgrades in the
// order the binary/schema contract sets: the migration Job completes, then
// the replicas roll.
func TestRunbookDescribesTheManifests(t *testing.T) {
	m := load(t)
	b, err := os.ReadFile(filepath.Join(harness.Root(t), "runbook.md"))
	require.NoError(t, err)
	text := string(b)
	start := strings.Index(text, "\n"+runbookSection+"\n")
	require.NotEqual(t, -1, start, "runbook.md has no %q", runbookSection)
	section := text[start+1:]
	if end := strings.Index(section[len(runbookSection):], "\n## "); end != -1 {
		section = section[:len(runbookSection)+end]
	}
	got := map[string]string{}
	for _, row := range reRunbookRow.FindAllStringSubmatch(section, -1) {
		got[row[1]] = row[2]
	}
	require.Equal(t, runbookFacts(m), got)
	// The overlay it shows: the replicas, the Job, every component, and the
	// namespace without which a component's ConfigMap is not found.
	require.Contains(t, section, "\nnamespace: wlproj ")
	for _, dir := range append([]string{"", "/migrate"}, prefixed("/", components)...) {
		require.Contains(t, section, "\n  - ../deploy/k8s"+dir+"\n", "the runbook's overlay")
	}

	steps := []string{
		"job=$(kubectl apply -k deploy/k8s/migrate -o name | grep '^job')",
		`kubectl -n wlproj wait --for=condition=complete "$job"`,
		"kubectl apply -k deploy/k8s\n",
		"kubectl -n wlproj rollout status deployment/wlproj",
	}
	at := 0
	for _, step := range steps {
		i := strings.Index(section[at:], step)
		require.NotEqual(t, -1, i, "the upgrade's steps, in order: %q missing after the previous one", step)
		at += i + len(step)
	}
}

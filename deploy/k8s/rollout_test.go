package k8s

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	"sigs.k8s.io/yaml"
)

// copyManifests is a copy of deploy/k8s in a directory of the test's own,
// with edit applied to the file at rel.
func copyManifests(t *testing.T, rel string, edit func(string) string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "k8s")
	require.NoError(t, os.CopyFS(dir, os.DirFS(".")))
	if rel != "" {
		b, err := os.ReadFile(filepath.Join(dir, rel))
		require.NoError(t, err)
		changed := edit(string(b))
		require.NotEqual(t, string(b), changed, "the edit of %s changes it", rel)
		require.NoError(t, os.WriteFile(filepath.Join(dir, rel), []byte(changed), 0o600))
	}
	return dir
}

// template is the Deployment's pod template as YAML: what Kubernetes
// compares to decide whether a Deployment rolls.
func template(t *testing.T, d *appsv1.Deployment) string {
	t.Helper()
	b, err := yaml.Marshal(d.Spec.Template)
	require.NoError(t, err)
	return string(b)
}

// A changed setting, a changed projections file or mapping, and turning
// the console on each change the pod template (the generated ConfigMap's
// name, hashed from its contents), so `kubectl apply -k` rolls the
// replicas; the same files render the same template, so an apply that
// changes nothing rolls nothing.
func TestManifestsConfigurationChangeRollsTheReplicas(t *testing.T) {
	unchanged := template(t, build(t, overlay(t, copyManifests(t, "", nil))).deployments[0])
	require.Equal(t, unchanged, template(t, build(t, overlay(t, ".")).deployments[0]), "a build is the same every time")
	base := template(t, build(t, ".").deployments[0])
	for _, tc := range []struct{ file, from, to string }{
		{"wlproj.env", "LOG_LEVEL=info", "LOG_LEVEL=debug"},
		{"projections/files/projections.yaml", "index: authors", "index: writers"},
		{"projections/files/books-mapping.json", `"isbn": {"type": "keyword"}`, `"isbn": {"type": "text"}`},
	} {
		dir := copyManifests(t, tc.file, func(s string) string { return strings.Replace(s, tc.from, tc.to, 1) })
		changed := build(t, overlay(t, dir)).deployments[0]
		require.NotEqual(t, unchanged, template(t, changed), "%s: %s → %s leaves the pod template as it was", tc.file, tc.from, tc.to)
		require.Equal(t, "wlproj", changed.Name, "the same Deployment, rolled, not a second one")
	}
	dir := copyManifests(t, "kustomization.yaml", func(s string) string {
		return strings.Replace(s, "components:\n  - version\n", "components:\n  - version\n  - console\n", 1)
	})
	require.NotEqual(t, base, template(t, build(t, dir).deployments[0]), "turning the console on rolls the replicas")
}

// Each release's migration Job has a name of its own, from the version
// label that matches the image's tag, so applying the next release's
// creates a Job instead of changing the last one's (which Kubernetes
// refuses); Argo CD runs it, with its ConfigMap, before the rest of a sync
// and Flux replaces it rather than fail.
func TestManifestsMigrationJobIsNamedByRelease(t *testing.T) {
	m := load(t)
	job := m.job()
	c := only(t, job.Spec.Template.Spec)
	tag := c.Image[strings.LastIndex(c.Image, ":")+1:]
	require.Equal(t, tag, job.Labels["app.kubernetes.io/version"], "version/: the label and newTag name one release")
	require.Equal(t, "wlproj-migrate-"+tag, job.Name)
	require.Equal(t, job.Name, m.full.jobs[0].Name, "an overlay keeps the name")
	require.Equal(t, "PreSync", job.Annotations["argocd.argoproj.io/hook"])
	require.Equal(t, "BeforeHookCreation", job.Annotations["argocd.argoproj.io/hook-delete-policy"])
	require.Equal(t, "enabled", job.Annotations["kustomize.toolkit.fluxcd.io/force"])
	cm := m.migrate.configMaps["wlproj-migrate"]
	require.NotNil(t, cm, "the Job's ConfigMap keeps its name: a changed hash would change the Job's pod template")
	require.Equal(t, "PreSync", cm.Annotations["argocd.argoproj.io/hook"], "Argo CD makes it before the Job that reads it")
	require.NotNil(t, job.Spec.TTLSecondsAfterFinished)

	dir := copyManifests(t, "version/kustomization.yaml", func(s string) string { return strings.ReplaceAll(s, "0.1.0", "0.2.0") })
	next := build(t, filepath.Join(dir, "migrate")).jobs[0]
	require.Equal(t, "wlproj-migrate-0.2.0", next.Name, "the next release's Job is a new one")
	requireSameJobSpecShape(t, job, next)
}

// requireSameJobSpecShape: two releases' Jobs differ in their name, labels
// and image only.
func requireSameJobSpecShape(t *testing.T, a, b *batchv1.Job) {
	t.Helper()
	a, b = a.DeepCopy(), b.DeepCopy()
	b.Name, b.Labels = a.Name, a.Labels
	b.Spec.Template.Spec.Containers[0].Image = a.Spec.Template.Spec.Containers[0].Image
	require.Equal(t, a, b)
}

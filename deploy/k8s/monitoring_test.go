package k8s

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/kube-openapi/pkg/validation/spec"
	"k8s.io/kube-openapi/pkg/validation/strfmt"
	"k8s.io/kube-openapi/pkg/validation/validate"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

const (
	podMonitorFile     = "monitoring/podmonitor.yaml"
	prometheusRuleFile = "monitoring/prometheusrule.yaml"
	alertsFile         = "../prometheus/alerts.yml"
	crdDir             = "testdata/crds"
	ruleSpecLine       = "spec:\n"
)

var updatePrometheusRule = flag.Bool("update-prometheusrule", false,
	"rewrite "+prometheusRuleFile+" below its spec: line from "+alertsFile)

// The operator's kinds decode strictly into its own Go types, of the
// release whose CRDs testdata/crds holds; registered here because
// TestManifestsDecodeStrictly decodes every file of the directory, these
// included.
func init() {
	kinds["monitoring.coreos.com/v1/PodMonitor"] = func() any { return &monitoringv1.PodMonitor{} }
	kinds["monitoring.coreos.com/v1/PrometheusRule"] = func() any { return &monitoringv1.PrometheusRule{} }
}

// crdSchemas reads the vendored CRDs: the openAPIV3Schema of each served
// version, by apiVersion/kind, made strict (denyUnknownFields).
func crdSchemas(t *testing.T) map[string]*spec.Schema {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(crdDir, "*.yaml"))
	require.NoError(t, err)
	require.Len(t, files, 2, "the PodMonitor's and the PrometheusRule's CRDs")
	schemas := map[string]*spec.Schema{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		var crd struct {
			Spec struct {
				Group    string                `json:"group"`
				Names    struct{ Kind string } `json:"names"`
				Versions []struct {
					Name   string `json:"name"`
					Schema struct {
						OpenAPIV3Schema json.RawMessage `json:"openAPIV3Schema"`
					} `json:"schema"`
				} `json:"versions"`
			} `json:"spec"`
		}
		require.NoError(t, yaml.Unmarshal(b, &crd), f)
		for _, v := range crd.Spec.Versions {
			s := &spec.Schema{}
			require.NoError(t, json.Unmarshal(v.Schema.OpenAPIV3Schema, s), f)
			denyUnknownFields(s, true)
			schemas[crd.Spec.Group+"/"+v.Name+"/"+crd.Spec.Names.Kind] = s
		}
	}
	return schemas
}

// denyUnknownFields makes every object of a CRD's schema refuse a field
// the schema does not name, as the API server does under strict field
// validation (kubectl's default; without it the field is silently pruned,
// which hides a typo just as well). Maps (additionalProperties) and
// x-kubernetes-preserve-unknown-fields stay open; so does the root's
// metadata, which the server checks as an ObjectMeta (the strict decode
// into the Go types does that here).
func denyUnknownFields(s *spec.Schema, root bool) {
	if s == nil {
		return
	}
	preserve, _ := s.Extensions["x-kubernetes-preserve-unknown-fields"].(bool)
	if s.Type.Contains("object") && s.AdditionalProperties == nil && !preserve {
		s.AdditionalProperties = &spec.SchemaOrBool{Allows: false}
	}
	for name, p := range s.Properties {
		if root && name == "metadata" {
			continue
		}
		denyUnknownFields(&p, false)
		s.Properties[name] = p
	}
	if s.Items != nil {
		denyUnknownFields(s.Items.Schema, false)
		for i := range s.Items.Schemas {
			denyUnknownFields(&s.Items.Schemas[i], false)
		}
	}
	if s.AdditionalProperties != nil {
		denyUnknownFields(s.AdditionalProperties.Schema, false)
	}
	for _, list := range [][]spec.Schema{s.AllOf, s.AnyOf, s.OneOf} {
		for i := range list {
			denyUnknownFields(&list[i], false)
		}
	}
}

// validateCRD checks one document of an operator kind against its CRD's
// schema (validateSchema) and decodes it strictly into its Go type.
func validateCRD(schemas map[string]*spec.Schema, doc []byte) error {
	if err := validateSchema(schemas, doc); err != nil {
		return err
	}
	_, err := decodeStrict(doc)
	return err
}

// validateSchema checks one document of an operator kind against its CRD's
// schema with the OpenAPI validator the API server uses (kube-openapi's).
func validateSchema(schemas map[string]*spec.Schema, doc []byte) error {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return err
	}
	schema, ok := schemas[tm.APIVersion+"/"+tm.Kind]
	if !ok {
		return &unknownKindError{tm.APIVersion + "/" + tm.Kind}
	}
	var obj any
	if err := yaml.Unmarshal(doc, &obj); err != nil {
		return err
	}
	return validate.NewSchemaValidator(schema, nil, "", strfmt.Default).Validate(obj).AsError()
}

type unknownKindError struct{ kind string }

func (e *unknownKindError) Error() string { return "no CRD in " + crdDir + " for " + e.kind }

// monitoringBuild builds the replicas with the monitoring component, as
// they build once deploy/k8s/kustomization.yaml lists it under
// components: the directory is copied into memory and the component added
// to the copy's kustomization.
func monitoringBuild(t *testing.T) []byte {
	t.Helper()
	fs := filesys.MakeFsInMemory()
	require.NoError(t, filepath.WalkDir(".", func(path string, e os.DirEntry, err error) error {
		// Every file kustomize may read (wlproj.env, mapping files), not the
		// Go sources or the CRDs.
		if err != nil || e.IsDir() || strings.HasSuffix(path, ".go") || strings.HasPrefix(path, crdDir) {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return fs.WriteFile(filepath.Join("/k8s", path), b)
	}))
	b, err := fs.ReadFile("/k8s/kustomization.yaml")
	require.NoError(t, err)
	var k types.Kustomization
	require.NoError(t, yaml.UnmarshalStrict(b, &k))
	if !slices.Contains(k.Components, "monitoring") {
		k.Components = append(k.Components, "monitoring")
	}
	b, err = yaml.Marshal(k)
	require.NoError(t, err)
	require.NoError(t, fs.WriteFile("/k8s/kustomization.yaml", b))
	resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fs, "/k8s")
	require.NoError(t, err, "kustomize build of the replicas with components: [monitoring]")
	out, err := resources.AsYaml()
	require.NoError(t, err)
	return out
}

// monitoringDocs are the documents of an operator kind in a YAML stream.
func monitoringDocs(t *testing.T, stream []byte) [][]byte {
	t.Helper()
	var docs [][]byte
	for _, doc := range strings.Split(string(stream), "\n---\n") {
		var tm metav1.TypeMeta
		require.NoError(t, yaml.Unmarshal([]byte(doc), &tm))
		if strings.HasPrefix(tm.APIVersion, "monitoring.coreos.com/") {
			docs = append(docs, []byte(doc))
		}
	}
	return docs
}

// The PodMonitor and the PrometheusRule, as written and as built into the
// replicas' namespace, are valid against the operator's CRDs (v0.93.0),
// strictly: a misspelt field, a wrong type or an unknown kind fails.
func TestMonitoringManifestsMatchTheirCRDs(t *testing.T) {
	schemas := crdSchemas(t)
	written := map[string][]byte{}
	for _, f := range []string{podMonitorFile, prometheusRuleFile} {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		written[f] = b
		require.NoError(t, validateCRD(schemas, b), f)
	}
	built := monitoringDocs(t, monitoringBuild(t))
	require.Len(t, built, 2)
	for _, doc := range built {
		require.NoError(t, validateCRD(schemas, doc), "built:\n%s", doc)
	}

	// The schema check can fail on its own, without the Go types' help:
	// each of these is refused by it.
	for _, bad := range []struct{ file, old, new string }{
		{podMonitorFile, "port: http", "portt: http"},                         // a misspelt field
		{podMonitorFile, "path: /metrics", "path: 8080"},                      // a number for a string
		{podMonitorFile, "  selector:", "  selectorr:"},                       // a required field missing
		{prometheusRuleFile, "for: 1m", "fore: 1m"},                           // deep in a rule
		{prometheusRuleFile, "for: 1m", "for: a minute"},                      // a duration the CRD's pattern refuses
		{prometheusRuleFile, "kind: PrometheusRule", "kind: PrometheusRules"}, // a kind with no CRD
	} {
		doc := strings.Replace(string(written[bad.file]), bad.old, bad.new, 1)
		require.NotEqual(t, string(written[bad.file]), doc, "%q is not in %s", bad.old, bad.file)
		err := validateSchema(schemas, []byte(doc))
		require.Error(t, err, "%s with %q accepted", bad.file, bad.new)
		t.Logf("%s with %q: %v", bad.file, bad.new, err)
	}
}

// indent puts every non-empty line of text two spaces in.
func indent(text string) string {
	lines := strings.SplitAfter(text, "\n")
	for i, l := range lines {
		if strings.TrimSpace(l) != "" {
			lines[i] = "  " + l
		}
	}
	return strings.Join(lines, "")
}

// The PrometheusRule holds exactly the rules of alerts.yml: its spec is
// that file, indented, comments and all, and it decodes to the same
// groups.
func TestPrometheusRuleHoldsTheAlerts(t *testing.T) {
	alerts, err := os.ReadFile(alertsFile)
	require.NoError(t, err)
	b, err := os.ReadFile(prometheusRuleFile)
	require.NoError(t, err)
	header, _, ok := strings.Cut(string(b), "\n"+ruleSpecLine)
	require.True(t, ok, "%s has no %q line", prometheusRuleFile, strings.TrimSpace(ruleSpecLine))
	want := header + "\n" + ruleSpecLine + indent(string(alerts))
	if *updatePrometheusRule {
		require.NoError(t, os.WriteFile(prometheusRuleFile, []byte(want), 0o644))
		b = []byte(want)
	}
	require.Equal(t, want, string(b), "%s differs from %s: run go test -run TestPrometheusRuleHoldsTheAlerts -update-prometheusrule", prometheusRuleFile, alertsFile)

	var file struct {
		Groups []monitoringv1.RuleGroup `json:"groups"`
	}
	require.NoError(t, yaml.UnmarshalStrict(alerts, &file), alertsFile)
	obj, err := decodeStrict(b)
	require.NoError(t, err)
	rule := obj.(*monitoringv1.PrometheusRule)
	require.Equal(t, file.Groups, rule.Spec.Groups)
	require.Len(t, rule.Spec.Groups, 1)
	require.NotEmpty(t, rule.Spec.Groups[0].Rules)
}

// The PodMonitor scrapes what the annotations point at: the replicas' pods
// (its selector matches their labels), on the container's named port of
// the annotated number, at the annotated path, in their namespace; the
// rule goes to that namespace too.
func TestPodMonitorScrapesTheReplicas(t *testing.T) {
	var (
		d    *appsv1.Deployment
		pm   *monitoringv1.PodMonitor
		rule *monitoringv1.PrometheusRule
	)
	for _, obj := range decodeAll(t, "the replicas with the monitoring component", monitoringBuild(t)) {
		switch obj := obj.(type) {
		case *appsv1.Deployment:
			d = obj
		case *monitoringv1.PodMonitor:
			pm = obj
		case *monitoringv1.PrometheusRule:
			rule = obj
		}
	}
	require.NotNil(t, d)
	require.NotNil(t, pm)
	require.NotNil(t, rule)
	require.Equal(t, d.Namespace, pm.Namespace)
	require.Equal(t, d.Namespace, rule.Namespace)
	require.Empty(t, pm.Spec.NamespaceSelector, "only its own namespace: one install per PodMonitor")

	selector, err := metav1.LabelSelectorAsSelector(&pm.Spec.Selector)
	require.NoError(t, err)
	require.False(t, selector.Empty())
	require.True(t, selector.Matches(labels.Set(d.Spec.Template.Labels)), "the PodMonitor selects the replicas' pods")

	require.Len(t, pm.Spec.PodMetricsEndpoints, 1)
	ep := pm.Spec.PodMetricsEndpoints[0]
	require.NotNil(t, ep.Port)
	ann := d.Spec.Template.Annotations
	require.Equal(t, ann["prometheus.io/path"], ep.Path)
	c := only(t, d.Spec.Template.Spec)
	var port int32
	for _, p := range c.Ports {
		if p.Name == *ep.Port {
			port = p.ContainerPort
		}
	}
	require.NotZero(t, port, "the container has no port named %q", *ep.Port)
	require.Equal(t, ann["prometheus.io/port"], strconv.Itoa(int(port)))
}

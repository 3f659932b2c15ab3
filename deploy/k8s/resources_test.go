package k8s

import (
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// GOMEMLIMIT is the container's own memory request, in bytes (no divisor,
// which the runtime would misread), and the request is below the limit:
// the collector works harder before the kernel would kill the container.
// Every pod has requests and a memory limit.
func TestManifestsMemoryLimitReachesGo(t *testing.T) {
	m := load(t)
	c := only(t, m.deployment().Spec.Template.Spec)
	i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "GOMEMLIMIT" })
	require.NotEqual(t, -1, i, "the replicas set GOMEMLIMIT")
	ref := c.Env[i].ValueFrom.ResourceFieldRef
	require.NotNil(t, ref)
	require.Equal(t, c.Name, ref.ContainerName)
	require.Equal(t, "requests.memory", ref.Resource)
	require.True(t, ref.Divisor.IsZero() || ref.Divisor.Value() == 1, "bytes: GOMEMLIMIT without a unit is bytes")
	request, limit := c.Resources.Requests[corev1.ResourceMemory], c.Resources.Limits[corev1.ResourceMemory]
	require.False(t, request.IsZero(), "a memory request")
	require.Equal(t, -1, request.Cmp(limit), "GOMEMLIMIT (the request) below the container's limit")
	_, cpuLimit := c.Resources.Limits[corev1.ResourceCPU]
	require.False(t, cpuLimit, "no CPU limit: a throttled leader misses its lock checks")
	for _, p := range m.pods() {
		c := only(t, p.spec)
		require.False(t, c.Resources.Requests.Memory().IsZero(), "%s: a memory request", p.what)
		require.False(t, c.Resources.Requests.Cpu().IsZero(), "%s: a CPU request", p.what)
		require.False(t, c.Resources.Limits.Memory().IsZero(), "%s: a memory limit", p.what)
	}
}

var reEngineURL = regexp.MustCompile(`https?://[^\s,\]]+`)

// port is a URL's port, or its scheme's.
func port(t *testing.T, raw string) int32 {
	t.Helper()
	u, err := url.Parse(raw)
	require.NoError(t, err, raw)
	if u.Port() == "" {
		return map[string]int32{"http": 80, "https": 443, "postgres": 5432}[u.Scheme]
	}
	p, err := strconv.Atoi(u.Port())
	require.NoError(t, err)
	return int32(p)
}

// allows says whether rules let TCP (or proto) to port through.
func allows(ports []networkingv1.NetworkPolicyPort, proto corev1.Protocol, port int32) bool {
	return slices.ContainsFunc(ports, func(p networkingv1.NetworkPolicyPort) bool {
		return p.Port != nil && p.Port.IntVal == port && (p.Protocol == nil || *p.Protocol == proto)
	})
}

// The NetworkPolicy lets in what scrapes and probes the pods (their HTTP
// port), and lets out what they connect to: DNS, the database URLs'
// port and every engine's, ELASTIC_URL's and the projections file's.
func TestManifestsNetworkPolicyFitsTheSettings(t *testing.T) {
	m := load(t)
	policy := m.full.policies[0]
	spec := m.full.deployments[0].Spec.Template.Spec
	require.NotEmpty(t, policy.Spec.PodSelector.MatchLabels)
	for k, v := range policy.Spec.PodSelector.MatchLabels {
		require.Equal(t, v, m.full.deployments[0].Spec.Template.Labels[k], "the replicas are selected")
		require.Equal(t, v, m.full.jobs[0].Spec.Template.Labels[k], "the Job's pod is selected too")
	}
	env, _ := m.containerEnv(t, m.full, only(t, spec))
	var in []networkingv1.NetworkPolicyPort
	for _, rule := range policy.Spec.Ingress {
		in = append(in, rule.Ports...)
	}
	require.True(t, allows(in, corev1.ProtocolTCP, int32(atoi(t, env["OUTBOX_HTTP_PORT"]))), "Prometheus reaches /metrics")
	require.Len(t, in, 1, "nothing but the HTTP port is let in")

	var out []networkingv1.NetworkPolicyPort
	for _, rule := range policy.Spec.Egress {
		out = append(out, rule.Ports...)
	}
	require.True(t, allows(out, corev1.ProtocolUDP, 53), "DNS")
	for _, s := range []string{"wlproj-database", "wlproj-migrate"} {
		require.True(t, allows(out, corev1.ProtocolTCP, port(t, m.secrets[s].StringData["DATABASE_URL"])), "%s's database", s)
	}
	file, ok := mounted(t, m.full, spec, env["OUTBOX_PROJECTIONS_FILE"])
	require.True(t, ok)
	engines := append(reEngineURL.FindAllString(file, -1), env["ELASTIC_URL"])
	require.GreaterOrEqual(t, len(engines), 3)
	for _, e := range engines {
		require.True(t, allows(out, corev1.ProtocolTCP, port(t, e)), "the engine at %s", e)
	}
}

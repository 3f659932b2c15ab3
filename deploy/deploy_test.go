// Package deploy holds the operator-facing files (systemd unit, Prometheus
// alerts, Grafana dashboard); its tests check them with the real tools.
package deploy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

const (
	alertsFile     = "prometheus/alerts.yml"
	alertsTestFile = "prometheus/alerts_test.yml"
	dashboardFile  = "grafana/wlproj.json"
	unitFile       = "systemd/wlproj@.service"
	envExampleFile = "systemd/wlproj.env.example"
)

// allowedMetrics are the series wlproj exports (the metric list plus
// outbox_ready), and Prometheus' own up. Alerts and panels may use no other.
var allowedMetrics = map[string]bool{
	"outbox_lag_events":                              true,
	"outbox_oldest_age_seconds":                      true,
	"outbox_inflight_events":                         true,
	"outbox_stuck_processing_events":                 true,
	"outbox_processed_total":                         true,
	"outbox_failed_total":                            true,
	"outbox_retry_scheduled_total":                   true,
	"outbox_terminal_failed_total":                   true,
	"outbox_reclaimed_total":                         true,
	"outbox_superseded_total":                        true,
	"outbox_replayed_total":                          true,
	"outbox_fenced_acks_total":                       true,
	"outbox_leader_changes_total":                    true,
	"outbox_leader":                                  true,
	"outbox_leader_epoch":                            true,
	"outbox_leader_refused":                          true,
	"outbox_queue_home_mismatch":                     true,
	"outbox_ready":                                   true,
	"outbox_batch_duration_seconds_bucket":           true,
	"outbox_batch_duration_seconds_sum":              true,
	"outbox_batch_duration_seconds_count":            true,
	"outbox_event_latency_seconds_bucket":            true,
	"outbox_event_latency_seconds_sum":               true,
	"outbox_event_latency_seconds_count":             true,
	"outbox_verify_drift_documents":                  true,
	"outbox_db_horizon_age_seconds":                  true,
	"outbox_db_horizon_age_transactions":             true,
	"outbox_db_horizon_holder_pid":                   true,
	"outbox_table_dead_tuples":                       true,
	"outbox_table_live_tuples":                       true,
	"outbox_table_last_autovacuum_timestamp_seconds": true,
	"outbox_schema_version":                          true,
	"outbox_schema_required_version":                 true,
	"outbox_claim_errors_total":                      true,
	"outbox_ack_errors_total":                        true,
	"outbox_reclaim_errors_total":                    true,
	"outbox_events_rotation_held":                    true,
	"outbox_rotation_errors_total":                   true,
	"outbox_rotation_last_success_timestamp_seconds": true,
	"outbox_projections_agree":                       true,
	"wlproj_build_info":                              true,
	"up":                                             true,
}

// promqlFunctions are the functions and aggregations our expressions may
// call; anything else is most likely a typo.
var promqlFunctions = map[string]bool{
	"sum": true, "max": true, "min": true, "avg": true, "count": true, "topk": true,
	"rate": true, "irate": true, "increase": true, "histogram_quantile": true,
	"absent": true, "present_over_time": true, "max_over_time": true, "clamp_min": true, "time": true,
	"group": true, "absent_over_time": true,
}

var promqlKeywords = map[string]bool{
	"and": true, "or": true, "unless": true, "bool": true, "offset": true, "inf": true, "nan": true,
}

var (
	reGrouping = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	reString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)
	reMatchers = regexp.MustCompile(`\{[^}]*\}`)
	reRange    = regexp.MustCompile(`\[[^\]]*\]`)
	reIdent    = regexp.MustCompile(`\b[a-zA-Z_][a-zA-Z0-9_:]*(\s*\()?`)
)

// metricNames returns the metric names an expression selects. It is not a
// PromQL parser: it strips what cannot hold a metric name (strings, label
// matchers, ranges, grouping clauses), then treats calls as functions and
// the remaining identifiers as metrics. That is enough for our own files.
func metricNames(t *testing.T, expr string) []string {
	t.Helper()
	s := reString.ReplaceAllString(expr, " ")
	s = reMatchers.ReplaceAllString(s, " ")
	s = reRange.ReplaceAllString(s, " ")
	s = reGrouping.ReplaceAllString(s, " ")
	var names []string
	for _, m := range reIdent.FindAllStringSubmatch(s, -1) {
		name := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(m[0]), "("))
		switch {
		case promqlKeywords[name]:
		case m[1] != "":
			require.True(t, promqlFunctions[name], "unexpected PromQL function %q in %q", name, expr)
		default:
			names = append(names, name)
		}
	}
	return names
}

func requireKnownMetrics(t *testing.T, where, expr string) []string {
	t.Helper()
	names := metricNames(t, expr)
	require.NotEmpty(t, names, "%s: no metric in %q", where, expr)
	for _, n := range names {
		require.True(t, allowedMetrics[n], "%s: unknown metric %q in %q", where, n, expr)
	}
	return names
}

func TestMetricNamesHelper(t *testing.T) {
	got := metricNames(t, `sum by (job, le) (rate(outbox_batch_duration_seconds_bucket{job=~"$job",x="up"}[$__rate_interval])) > 0 or absent(outbox_leader) unless(x offset 10m)`)
	require.Equal(t, []string{"outbox_batch_duration_seconds_bucket", "outbox_leader", "x"}, got)
}

// requireTool fails, not skips: a missing tool must not pass CI silently.
func requireTool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is not installed: run scripts/tools.sh (as root) to install it", name)
	}
	return path
}

func TestPromtoolCheckRules(t *testing.T) {
	t.Parallel()
	promtool := requireTool(t, "promtool")
	out, err := exec.Command(promtool, "check", "rules", alertsFile).CombinedOutput()
	require.NoError(t, err, "%s", out)
}

func TestPromtoolTestRules(t *testing.T) {
	t.Parallel()
	promtool := requireTool(t, "promtool")
	out, err := exec.Command(promtool, "test", "rules", alertsTestFile).CombinedOutput()
	require.NoError(t, err, "%s", out)
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

type ruleTestFile struct {
	Tests []struct {
		InputSeries []struct {
			Series string `yaml:"series"`
		} `yaml:"input_series"`
		AlertRuleTest []struct {
			Alertname string           `yaml:"alertname"`
			ExpAlerts []map[string]any `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(b, v), path)
}

var wantAlerts = []string{
	"OutboxRotationHeld",
	"OutboxRotationFailing",
	"OutboxOldestPendingWarning",
	"OutboxOldestPendingCritical",
	"OutboxStuckProcessing",
	"OutboxTerminalFailures",
	"OutboxNoLeader",
	"OutboxSplitBrain",
	"OutboxLeaderFlapping",
	"OutboxReplicaNotReady",
	"OutboxIndexDrift",
	"OutboxVacuumHorizonHeld",
	"OutboxDeadTuplesNotReclaimed",
	"OutboxSchemaBehind",
	"OutboxLeaderErrors",
	"OutboxLeaderRefused",
	"OutboxQueueHomeMismatch",
	"OutboxProjectionsDisagree",
}

var reRunbookURL = regexp.MustCompile(`^https://\S+/runbook\.md#([a-z0-9-]+)$`)

// runbookAnchors returns the anchor of every alert's runbook_url.
func runbookAnchors(t *testing.T) map[string]string {
	t.Helper()
	var rf ruleFile
	readYAML(t, alertsFile, &rf)
	anchors := map[string]string{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if m := reRunbookURL.FindStringSubmatch(r.Labels["runbook_url"]); m != nil {
				anchors[r.Alert] = m[1]
			}
		}
	}
	return anchors
}

func TestAlertRules(t *testing.T) {
	t.Parallel()
	var rf ruleFile
	readYAML(t, alertsFile, &rf)
	require.Len(t, rf.Groups, 1)
	require.Equal(t, "wlproj", rf.Groups[0].Name)

	var names []string
	for _, r := range rf.Groups[0].Rules {
		names = append(names, r.Alert)
		require.Contains(t, []string{"warning", "critical"}, r.Labels["severity"], r.Alert)
		require.Regexp(t, reRunbookURL, r.Labels["runbook_url"], r.Alert)
		require.NotEmpty(t, r.Annotations["summary"], r.Alert)
		require.NotEmpty(t, r.Annotations["description"], r.Alert)
		requireKnownMetrics(t, r.Alert, r.Expr)
	}
	require.ElementsMatch(t, wantAlerts, names)

	// Every alert is shown both firing and quiet by the promtool tests.
	var tf ruleTestFile
	readYAML(t, alertsTestFile, &tf)
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range tf.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	for _, name := range wantAlerts {
		require.True(t, fires[name], "no promtool test shows %s firing", name)
		require.True(t, quiet[name], "no promtool test shows %s not firing", name)
	}
}

// annotationJob is the job the common annotation-based scrape config gives
// every pod it discovers; a PodMonitor's job is "<namespace>/<name>".
const annotationJob = "kubernetes-pods"

var (
	reSeriesLabel = regexp.MustCompile(`(\w+)="([^"]*)"`)
	rePodMonitor  = regexp.MustCompile(`^([a-z0-9-]+)/[a-z0-9-]+$`)
)

// install is what tells two wlproj installs apart: the alerts' key.
type install struct{ namespace, job string }

// podMonitor says whether an install is scraped through a PodMonitor.
func (i install) podMonitor() bool {
	m := rePodMonitor.FindStringSubmatch(i.job)
	return m != nil && m[1] == i.namespace
}

func installOf(labels map[string]string) install {
	return install{namespace: labels["namespace"], job: labels["job"]}
}

// Two installs in one cluster must each be paged for their own problem:
// for every alert, some promtool test feeds it installs under annotation
// discovery and under PodMonitors and expects it to fire for one install of
// each kind while another of the same kind, in its input, stays quiet.
func TestAlertsArePerInstall(t *testing.T) {
	t.Parallel()
	var tf ruleTestFile
	readYAML(t, alertsTestFile, &tf)
	shown := map[string]bool{}
	for _, tc := range tf.Tests {
		inputs := map[install]bool{}
		for _, in := range tc.InputSeries {
			labels := map[string]string{}
			for _, m := range reSeriesLabel.FindAllStringSubmatch(in.Series, -1) {
				labels[m[1]] = m[2]
			}
			inputs[installOf(labels)] = true
		}
		for _, a := range tc.AlertRuleTest {
			firing := map[install]bool{}
			for _, exp := range a.ExpAlerts {
				labels := map[string]string{}
				for k, v := range exp["exp_labels"].(map[string]any) {
					labels[k] = fmt.Sprint(v)
				}
				firing[installOf(labels)] = true
			}
			// kind: 0 annotation discovery, 1 PodMonitor; [fires, quiet].
			var seen [2][2]bool
			for in := range inputs {
				if in.namespace == "" || (in.job != annotationJob && !in.podMonitor()) {
					continue
				}
				kind := 0
				if in.podMonitor() {
					kind = 1
				}
				if firing[in] {
					seen[kind][0] = true
				} else {
					seen[kind][1] = true
				}
			}
			if seen == [2][2]bool{{true, true}, {true, true}} {
				shown[a.Alertname] = true
			}
		}
	}
	for _, name := range wantAlerts {
		require.True(t, shown[name], "no promtool test shows %s firing for one install and not another, both under annotation discovery and under PodMonitors", name)
	}
}

var (
	reHeading  = regexp.MustCompile(`(?m)^#{1,6}\s+(.+?)\s*#*\s*$`)
	reExplicit = regexp.MustCompile(`(?:id|name)="([^"]+)"|\{#([a-z0-9-]+)\}`)
	reSlugDrop = regexp.MustCompile(`[^\p{L}\p{N} _-]`)
)

// githubSlug is the anchor GitHub gives a Markdown heading.
func githubSlug(heading string) string {
	s := strings.ToLower(strings.TrimSpace(heading))
	s = reSlugDrop.ReplaceAllString(s, "")
	return strings.ReplaceAll(s, " ", "-")
}

func TestRunbookAnchors(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../runbook.md")
	if os.IsNotExist(err) {
		t.Skip("runbook.md is not written yet; the alerts link to its anchors")
	}
	require.NoError(t, err)
	have := map[string]bool{}
	for _, m := range reHeading.FindAllStringSubmatch(string(b), -1) {
		have[githubSlug(m[1])] = true
	}
	for _, m := range reExplicit.FindAllStringSubmatch(string(b), -1) {
		have[m[1]+m[2]] = true
	}
	for alert, anchor := range runbookAnchors(t) {
		require.True(t, have[anchor], "%s links to runbook.md#%s, which has no such heading or anchor", alert, anchor)
	}
}

func TestGrafanaDashboard(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(dashboardFile)
	require.NoError(t, err)
	var dash map[string]any
	require.NoError(t, json.Unmarshal(b, &dash))
	require.NotContains(t, dash, "__inputs", "an exported dashboard with ${DS_...} inputs needs manual import; use the datasource variable")

	// The datasource variable exists and is a Prometheus picker.
	vars := dash["templating"].(map[string]any)["list"].([]any)
	var dsVar map[string]any
	for _, v := range vars {
		if v := v.(map[string]any); v["name"] == "datasource" {
			dsVar = v
		}
	}
	require.NotNil(t, dsVar, "no datasource template variable")
	require.Equal(t, "datasource", dsVar["type"])
	require.Equal(t, "prometheus", dsVar["query"])

	// Every datasource reference anywhere is the variable.
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, child := range v {
				if k == "datasource" {
					requireDatasourceVar(t, path, child)
					continue
				}
				walk(path+"."+k, child)
			}
		case []any:
			for _, child := range v {
				walk(path, child)
			}
		}
	}
	walk("", dash)

	panels := dash["panels"].([]any)
	ids := map[float64]bool{}
	used := map[string]bool{}
	for _, p := range panels {
		p := p.(map[string]any)
		title, _ := p["title"].(string)
		id := p["id"].(float64)
		require.False(t, ids[id], "duplicate panel id %v", id)
		ids[id] = true
		if p["type"] == "row" {
			require.NotContains(t, p, "targets", title)
			continue
		}
		require.Contains(t, p, "datasource", "panel %q", title)
		targets, _ := p["targets"].([]any)
		require.NotEmpty(t, targets, "panel %q has no queries", title)
		for _, tg := range targets {
			tg := tg.(map[string]any)
			require.Contains(t, tg, "datasource", "panel %q target %v", title, tg["refId"])
			expr, _ := tg["expr"].(string)
			requireOneInstall(t, title, expr)
			for _, n := range requireKnownMetrics(t, "panel "+title, expr) {
				used[n] = true
			}
		}
	}
	for _, m := range []string{
		"outbox_lag_events", "outbox_oldest_age_seconds", "outbox_processed_total",
		"outbox_failed_total", "outbox_terminal_failed_total", "outbox_leader",
		"outbox_leader_epoch", "outbox_batch_duration_seconds_bucket", "outbox_event_latency_seconds_bucket",
	} {
		require.True(t, used[m], "no panel shows %s", m)
	}
}

var reSelector = regexp.MustCompile(`\{[^}]*\}`)

// requireOneInstall checks a panel's query the way the alerts are keyed:
// every selector picks the chosen job and namespace (two installs under
// annotation discovery share a job), and a grouping by job also groups by
// namespace.
func requireOneInstall(t *testing.T, title, expr string) {
	t.Helper()
	selectors := reSelector.FindAllString(expr, -1)
	require.NotEmpty(t, selectors, "panel %q: %s", title, expr)
	for _, sel := range selectors {
		require.Contains(t, sel, `job=~"$job"`, "panel %q: %s", title, expr)
		require.Contains(t, sel, `namespace=~"$namespace"`, "panel %q: %s", title, expr)
	}
	for _, g := range reGrouping.FindAllString(expr, -1) {
		if strings.Contains(g, "job") {
			require.Contains(t, g, "namespace", "panel %q: %s", title, expr)
		}
	}
}

func requireDatasourceVar(t *testing.T, path string, ds any) {
	t.Helper()
	switch ds := ds.(type) {
	case string:
		require.Contains(t, []string{"${datasource}", "$datasource"}, ds, path)
	case map[string]any:
		require.Equal(t, "prometheus", ds["type"], path)
		require.Equal(t, "${datasource}", ds["uid"], path)
	default:
		t.Fatalf("%s: datasource %v is neither the variable nor a {type, uid} reference", path, ds)
	}
}

// unit is a parsed systemd unit: section → key → values in order.
type unit map[string]map[string][]string

func parseUnit(t *testing.T, text string) unit {
	t.Helper()
	u := unit{}
	section := ""
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "["):
			section = strings.Trim(line, "[]")
			u[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			require.True(t, ok, "unit line %q", line)
			require.NotEmpty(t, section, "unit line %q outside a section", line)
			u[section][k] = append(u[section][k], v)
		}
	}
	return u
}

func (u unit) one(t *testing.T, section, key string) string {
	t.Helper()
	vs := u[section][key]
	require.Len(t, vs, 1, "[%s] %s", section, key)
	return vs[0]
}

// systemdSeconds parses a systemd time span of the forms we use ("45s", "1min", "30").
func systemdSeconds(t *testing.T, s string) time.Duration {
	t.Helper()
	if n, err := strconv.Atoi(s); err == nil {
		return time.Duration(n) * time.Second
	}
	d, err := time.ParseDuration(strings.ReplaceAll(s, "min", "m"))
	require.NoError(t, err, "time span %q", s)
	return d
}

func readUnit(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(unitFile)
	require.NoError(t, err)
	return string(b)
}

func TestSystemdUnitDirectives(t *testing.T) {
	t.Parallel()
	u := parseUnit(t, readUnit(t))
	for key, want := range map[string]string{
		"Type":            "notify",
		"NotifyAccess":    "main",
		"WatchdogSec":     "10s",
		"ExecStart":       "/usr/bin/wlproj run",
		"EnvironmentFile": "/etc/wlproj/%i.env",
		"Restart":         "always",
		"RestartSec":      "1",
		"KillSignal":      "SIGTERM",

		"User":                    "wlproj",
		"DynamicUser":             "yes",
		"NoNewPrivileges":         "yes",
		"ProtectSystem":           "strict",
		"ProtectHome":             "yes",
		"PrivateTmp":              "yes",
		"PrivateDevices":          "yes",
		"ProtectKernelTunables":   "yes",
		"ProtectKernelModules":    "yes",
		"RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
		"LockPersonality":         "yes",
		"MemoryDenyWriteExecute":  "yes",
		"SystemCallArchitectures": "native",
		"CapabilityBoundingSet":   "",
	} {
		require.Equal(t, want, u.one(t, "Service", key), key)
	}
	require.Contains(t, u["Service"]["Environment"], "OUTBOX_WORKER_ID=%H-%i")
	require.Equal(t, "multi-user.target", u.one(t, "Install", "WantedBy"))

	// The stop timeout must outlast the drain, or systemd SIGKILLs mid-drain.
	grace, err := strconv.ParseFloat(envExample(t)["OUTBOX_SHUTDOWN_GRACE_SECONDS"].value, 64)
	require.NoError(t, err)
	stop := systemdSeconds(t, u.one(t, "Service", "TimeoutStopSec"))
	require.Greater(t, stop, time.Duration(grace*float64(time.Second))+10*time.Second,
		"TimeoutStopSec %s leaves too little room after the %gs drain grace", stop, grace)
}

// verifyUnit runs systemd-analyze verify on text installed as
// wlproj@test.service and returns the messages about that unit.
func verifyUnit(t *testing.T, text string) []string {
	t.Helper()
	sa := requireTool(t, "systemd-analyze")
	dir := t.TempDir()
	path := filepath.Join(dir, "wlproj@test.service")
	require.NoError(t, os.WriteFile(path, []byte(text), 0o644))
	out, err := exec.Command(sa, "verify", path).CombinedOutput()

	// In a container systemd-analyze may also complain about the host (no
	// running systemd, missing units it pulls in); only our unit's lines count.
	var ours, other []string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.TrimSpace(line) == "":
		case strings.Contains(line, "wlproj@test") || strings.Contains(line, dir):
			ours = append(ours, line)
		default:
			other = append(other, line)
		}
	}
	if len(other) > 0 {
		t.Logf("systemd-analyze messages not about the unit, ignored:\n%s", strings.Join(other, "\n"))
	}
	if err != nil && len(ours) == 0 && len(other) == 0 {
		t.Fatalf("systemd-analyze verify failed without a message: %v", err)
	}
	return ours
}

func TestSystemdAnalyzeVerify(t *testing.T) {
	t.Parallel()
	text := readUnit(t)
	// verify checks that ExecStart exists and is executable, so point it at
	// the real binary; everything else is verified as shipped.
	const execStart = "ExecStart=/usr/bin/wlproj run"
	require.Contains(t, text, execStart)
	text = strings.Replace(text, execStart, "ExecStart="+harness.Binary(t)+" run", 1)
	require.Empty(t, verifyUnit(t, text), "systemd-analyze verify complains about the unit")

	// The filter must not hide real problems: a typo is reported as ours.
	broken := strings.Replace(text, "Type=notify", "Type=notifyy\nProtectSystm=strict", 1)
	require.NotEmpty(t, verifyUnit(t, broken), "systemd-analyze verify did not flag a broken unit")
}

type envVar struct {
	value     string
	commented bool
}

var reEnvLine = regexp.MustCompile(`^(#\s*)?([A-Z][A-Z0-9_]*)=(.*)$`)

// envExample parses the example env file: active and commented assignments.
func envExample(t *testing.T) map[string]envVar {
	t.Helper()
	b, err := os.ReadFile(envExampleFile)
	require.NoError(t, err)
	vars := map[string]envVar{}
	prev := ""
	for _, line := range strings.Split(string(b), "\n") {
		if m := reEnvLine.FindStringSubmatch(line); m != nil {
			require.NotContains(t, vars, m[2], "%s twice in the example", m[2])
			require.True(t, strings.HasPrefix(prev, "#") && !reEnvLine.MatchString(prev),
				"%s has no comment line above it", m[2])
			vars[m[2]] = envVar{value: m[3], commented: m[1] != ""}
		}
		prev = line
	}
	return vars
}

var (
	reHelpFlag = regexp.MustCompile(`^\s+(?:-\w, )?--[a-z0-9-]+(?:=("(?:[^"\\]|\\.)*"|\S+))?`)
	reHelpEnv  = regexp.MustCompile(`\(\$([A-Z][A-Z0-9_]*)\)`)
	rePlace    = regexp.MustCompile(`^[A-Z][A-Z0-9-]*$`)
)

// runFlagDefaults reads `wlproj run --help`: env var → default as printed.
func runFlagDefaults(t *testing.T) map[string]string {
	t.Helper()
	cmd := exec.Command(harness.Binary(t), "run", "--help")
	cmd.Env = append(os.Environ(), "COLUMNS=200")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)

	defaults := map[string]string{}
	var entry, def string
	flush := func() {
		if m := reHelpEnv.FindStringSubmatch(entry); m != nil {
			defaults[m[1]] = def
		}
	}
	for _, line := range strings.Split(string(out), "\n") {
		m := reHelpFlag.FindStringSubmatch(line)
		if m == nil {
			entry += " " + line
			continue
		}
		flush()
		entry, def = line, ""
		switch v := m[1]; {
		case !strings.Contains(m[0], "="):
			def = "false" // a bool flag shows no default
		case strings.HasPrefix(v, `"`):
			def, err = strconv.Unquote(v)
			require.NoError(t, err)
		case rePlace.MatchString(v): // STRING, INT: no default
		default:
			def = v
		}
	}
	flush()
	require.NotEmpty(t, defaults, "no env vars found in:\n%s", out)
	return defaults
}

func TestEnvExample(t *testing.T) {
	t.Parallel()
	vars := envExample(t)
	for _, k := range []string{"DATABASE_URL", "ELASTIC_URL"} {
		require.False(t, vars[k].commented, "%s must be set in the example", k)
	}
	// The unit sets OUTBOX_WORKER_ID; an active line would override it.
	require.True(t, vars["OUTBOX_WORKER_ID"].commented)

	// The example lists exactly the run command's env vars, commented ones
	// with the binary's own defaults.
	defaults := runFlagDefaults(t)
	var missing, unknown []string
	for k, def := range defaults {
		v, ok := vars[k]
		if !ok {
			missing = append(missing, k)
			continue
		}
		if v.commented {
			require.Equal(t, def, v.value, "%s: the example's default differs from `wlproj run --help`", k)
		}
	}
	for k := range vars {
		if _, ok := defaults[k]; !ok {
			unknown = append(unknown, k)
		}
	}
	slices.Sort(missing)
	slices.Sort(unknown)
	require.Empty(t, missing, "env vars of `wlproj run` missing from %s", envExampleFile)
	require.Empty(t, unknown, "env vars in %s that `wlproj run` does not read", envExampleFile)
}

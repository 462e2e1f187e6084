package test

import (
	"net/http/httptest"
	"os"
	"os/exec"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/kustomize"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/metrics"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
)

// The opt-in Prometheus pieces: deploy/components/prometheus (scrapeable
// endpoint and PodMonitor), deploy/components/prometheus-rules
// (PrometheusRule) and deploy/prometheus/alerts.yaml (the same rules as a
// plain rule file).

// ruleFile is a Prometheus rule file (the spec of a PrometheusRule).
type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Expr        string            `json:"expr"`
			For         string            `json:"for,omitempty"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

type podMonitor struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		Selector            metav1.LabelSelector `json:"selector"`
		PodMetricsEndpoints []struct {
			Port        string `json:"port"`
			Path        string `json:"path"`
			Interval    string `json:"interval"`
			Relabelings []struct {
				SourceLabels []string `json:"sourceLabels"`
				TargetLabel  string   `json:"targetLabel"`
			} `json:"relabelings"`
		} `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

type prometheusRule struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       ruleFile          `json:"spec"`
}

// TestManifestsPrometheusComponents renders deploy/ with both components,
// as an operator's kustomization would: the agent listens on the node's
// address, the probes follow it, the PodMonitor selects the agent's pods
// on a port they have, and the PrometheusRule holds the rule file's rules.
func TestManifestsPrometheusComponents(t *testing.T) {
	data, err := kustomize.RenderOverlay("..", "prometheus-overlay-test",
		"resources:\n  - ../deploy\ncomponents:\n  - ../deploy/components/prometheus\n  - ../deploy/components/prometheus-rules\n")
	if err != nil {
		t.Fatal(err)
	}
	var ds *appsv1.DaemonSet
	var pm *podMonitor
	var pr *prometheusRule
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatal(err)
		}
		var out any
		switch tm.Kind {
		case "DaemonSet":
			ds = new(appsv1.DaemonSet)
			out = ds
		case "PodMonitor":
			pm = new(podMonitor)
			out = pm
		case "PrometheusRule":
			pr = new(prometheusRule)
			out = pr
		default:
			t.Errorf("an object of kind %q", tm.Kind)
			continue
		}
		if err := decodeStrict([]byte(doc), out); err != nil {
			t.Fatalf("%s: %v", tm.Kind, err)
		}
	}
	if ds == nil || pm == nil || pr == nil {
		t.Fatalf("want a DaemonSet, a PodMonitor and a PrometheusRule; have %v %v %v", ds != nil, pm != nil, pr != nil)
	}
	c := ds.Spec.Template.Spec.Containers[0]
	var addrs []string
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--http-address="); ok {
			addrs = append(addrs, v)
		}
	}
	if !slices.Equal(addrs, []string{"$(NODE_IP):9753"}) {
		t.Errorf("--http-address %q, want $(NODE_IP):9753", addrs)
	}
	if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
		return e.Name == "NODE_IP" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.hostIP"
	}) {
		t.Errorf("env %+v: want NODE_IP from status.hostIP", c.Env)
	}
	for name, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		// The kubelet probes the pod's IP, the node's with hostNetwork:
		// where the agent now listens.
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Host != "" || p.HTTPGet.Port.String() != "9753" {
			t.Errorf("%s probe %+v: want httpGet on port 9753 without host", name, p)
		}
	}
	if a := ds.Spec.Template.Annotations; a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != "9753" {
		t.Errorf("annotations %v", a)
	}
	if pm.APIVersion != "monitoring.coreos.com/v1" || pm.Metadata.Namespace != ds.Namespace {
		t.Errorf("PodMonitor %s in %q", pm.APIVersion, pm.Metadata.Namespace)
	}
	sel, err := metav1.LabelSelectorAsSelector(&pm.Spec.Selector)
	if err != nil || sel.Empty() || !sel.Matches(labels.Set(ds.Spec.Template.Labels)) {
		t.Errorf("PodMonitor selector %v does not select the agent's pods %v (%v)", sel, ds.Spec.Template.Labels, err)
	}
	if len(pm.Spec.PodMetricsEndpoints) != 1 || pm.Spec.PodMetricsEndpoints[0].Path != "/metrics" ||
		!slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool {
			return p.Name == pm.Spec.PodMetricsEndpoints[0].Port && p.ContainerPort == 9753
		}) {
		t.Errorf("PodMonitor endpoints %+v: want /metrics on the container's port named http (9753)", pm.Spec.PodMetricsEndpoints)
	}
	// The alerts name the node: the PodMonitor gives each series the
	// pod's node as label node.
	if len(pm.Spec.PodMetricsEndpoints) == 1 && !slices.ContainsFunc(pm.Spec.PodMetricsEndpoints[0].Relabelings, func(r struct {
		SourceLabels []string `json:"sourceLabels"`
		TargetLabel  string   `json:"targetLabel"`
	}) bool {
		return slices.Equal(r.SourceLabels, []string{"__meta_kubernetes_pod_node_name"}) && r.TargetLabel == "node"
	}) {
		t.Errorf("PodMonitor relabelings %+v: want __meta_kubernetes_pod_node_name -> node (the alerts name the node)", pm.Spec.PodMetricsEndpoints[0].Relabelings)
	}
	plain := readRuleFile(t)
	if pr.APIVersion != "monitoring.coreos.com/v1" || !reflect.DeepEqual(pr.Spec, plain) {
		t.Errorf("the PrometheusRule's spec differs from deploy/prometheus/alerts.yaml")
	}

	// With the documented private-registry overlay too: the components
	// and the image overlay compose (the image is the overlay's, the
	// address the component's).
	var ex imageComponent
	if err := decodeStrictFile(t, "../examples/private-registry/image/kustomization.yaml", &ex); err != nil {
		t.Fatal(err)
	}
	data, err = kustomize.RenderOverlay("..", "prometheus-registry-overlay-test",
		"resources:\n  - ../examples/private-registry\ncomponents:\n  - ../deploy/components/prometheus\n  - ../deploy/components/prometheus-rules\n")
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatal(err)
		}
		kinds[tm.Kind]++
		if tm.Kind != "DaemonSet" {
			continue
		}
		var d appsv1.DaemonSet
		if err := decodeStrict([]byte(doc), &d); err != nil {
			t.Fatal(err)
		}
		c := d.Spec.Template.Spec.Containers[0]
		if want := ex.Images[0].NewName + ":" + ex.Images[0].NewTag; c.Image != want || !slices.Contains(c.Args, "--http-address=$(NODE_IP):9753") {
			t.Errorf("private registry with the Prometheus components: image %q (want %q), args %q (want --http-address=$(NODE_IP):9753)", c.Image, want, c.Args)
		}
	}
	if kinds["DaemonSet"] != 1 || kinds["PodMonitor"] != 1 || kinds["PrometheusRule"] != 1 {
		t.Errorf("private registry with the Prometheus components renders %v, want one DaemonSet, PodMonitor and PrometheusRule", kinds)
	}
}

func readRuleFile(t *testing.T) ruleFile {
	t.Helper()
	data, err := os.ReadFile(deployDir + "/prometheus/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := decodeStrict(data, &rf); err != nil {
		t.Fatalf("deploy/prometheus/alerts.yaml: %v", err)
	}
	return rf
}

// agentMetricNames are the metric families the agent exports.
func agentMetricNames(t *testing.T) map[string]string {
	t.Helper()
	m := metrics.New("test", func() ([]metrics.RuleCounter, error) {
		return []metrics.RuleCounter{{Family: "ipv4", Decision: "masquerade", Reason: "outbound"}}, nil
	})
	m.ConfigApplied("0123456789abcdef")
	m.SetElements("nonmasq-v4", "ipv4", "nonmasquerade", 1, 1)
	m.SyncDone("success", time.Millisecond)
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	names := map[string]string{}
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			names[f[2]] = f[3]
		}
	}
	return names
}

// unknownMetrics returns the names in used that the agent does not export
// (a histogram's _bucket, _sum and _count series are its own).
func unknownMetrics(names map[string]string, used []string) []string {
	var out []string
	for _, name := range used {
		base := name
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(name, suffix); ok && names[b] == "histogram" {
				base = b
			}
		}
		if names[base] == "" {
			out = append(out, name)
		}
	}
	return out
}

var (
	metricRE  = regexp.MustCompile(`\bip_masq_agent_[a-z0-9_]+`)
	durationR = regexp.MustCompile(`^([0-9]+(ms|s|m|h|d|w|y))+$`)
	labelRE   = regexp.MustCompile(`\{\{\s*\$labels\.([a-z_]+)\s*\}\}`)
)

// TestPrometheusAlerts: the rule file parses; each alert has a severity, a
// summary and a runbook_url into docs/runbook.md whose anchor exists; its
// expression names only metrics the agent exports; and, when promtool is
// installed (Debian: prometheus), promtool check rules accepts the file.
func TestPrometheusAlerts(t *testing.T) {
	rf := readRuleFile(t)
	names := agentMetricNames(t)
	if len(names) < 10 {
		t.Fatalf("found only %d metric families", len(names))
	}
	runbook := anchors(t, "../docs/runbook.md")
	n := 0
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			n++
			if r.Alert == "" || r.Expr == "" {
				t.Errorf("group %s: a rule without alert or expr: %+v", g.Name, r)
				continue
			}
			if r.For != "" && !durationR.MatchString(r.For) {
				t.Errorf("%s: for %q is not a Prometheus duration", r.Alert, r.For)
			}
			if s := r.Labels["severity"]; s != "critical" && s != "warning" && s != "info" {
				t.Errorf("%s: severity %q", r.Alert, s)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: want a summary and a description", r.Alert)
			}
			const prefix = "https://github.com/ip-masq-agent/ip-masq-agent-nft/blob/main/docs/runbook.md#"
			if a, ok := strings.CutPrefix(r.Annotations["runbook_url"], prefix); !ok || !runbook[a] {
				t.Errorf("%s: runbook_url %q is not a heading of docs/runbook.md", r.Alert, r.Annotations["runbook_url"])
			}
			used := metricRE.FindAllString(r.Expr, -1)
			if len(used) == 0 && !strings.Contains(r.Expr, "up{") {
				t.Errorf("%s: the expression names no metric of the agent: %s", r.Alert, r.Expr)
			}
			for _, name := range unknownMetrics(names, used) {
				t.Errorf("%s: %s is not a metric the agent exports", r.Alert, name)
			}
			if strings.Count(r.Expr, "(") != strings.Count(r.Expr, ")") || strings.Count(r.Expr, "{") != strings.Count(r.Expr, "}") {
				t.Errorf("%s: unbalanced brackets: %s", r.Alert, r.Expr)
			}
			for _, m := range labelRE.FindAllStringSubmatch(r.Annotations["summary"]+r.Annotations["description"], -1) {
				if !slices.Contains([]string{"instance", "node", "job", "namespace", "pod"}, m[1]) && !strings.Contains(r.Expr, m[1]) && !slices.Contains([]string{"what", "family"}, m[1]) {
					t.Errorf("%s: annotation uses $labels.%s, which the expression does not keep", r.Alert, m[1])
				}
			}
		}
	}
	if n < 5 {
		t.Errorf("%d alerts, want the runbook's", n)
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		reason := testnet.MissingReason("promtool")
		if os.Geteuid() == 0 || os.Getenv("CI") == "true" {
			t.Fatalf("%s: promtool check rules cannot run", reason)
		}
		t.Skip(reason)
	}
	if out, err := exec.Command(promtool, "check", "rules", deployDir+"/prometheus/alerts.yaml").CombinedOutput(); err != nil {
		t.Errorf("promtool check rules: %v\n%s", err, out)
	}
}

// TestGrafanaDashboard: deploy/grafana/ip-masq-agent.json is a dashboard
// whose every query names only metrics the agent exports.
func TestGrafanaDashboard(t *testing.T) {
	data, err := os.ReadFile(deployDir + "/grafana/ip-masq-agent.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := yaml.Unmarshal(data, &d); err != nil {
		t.Fatalf("deploy/grafana/ip-masq-agent.json: %v", err)
	}
	names := agentMetricNames(t)
	n := 0
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			n++
			used := metricRE.FindAllString(q.Expr, -1)
			if len(used) == 0 {
				t.Errorf("panel %q: the query names no metric of the agent: %s", p.Title, q.Expr)
			}
			for _, name := range unknownMetrics(names, used) {
				t.Errorf("panel %q: %s is not a metric the agent exports", p.Title, name)
			}
		}
	}
	if d.Title == "" || n < 5 {
		t.Errorf("dashboard %q with %d queries", d.Title, n)
	}
}

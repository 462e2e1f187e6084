package test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"sigs.k8s.io/yaml"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/agent"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/metrics"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
	"github.com/ip-masq-agent/ip-masq-agent-nft/original"
)

// The shipped alerts, evaluated by promtool against what the agent really
// exports: the agent's loop (internal/agent, on the in-memory kernel) is
// run in each state, its /metrics scraped once a simulated minute, and the
// scrapes become promtool's input series, with the target labels the
// shipped PodMonitor gives them (node among them). Each state fires the
// alerts it should and no other.

const (
	alertScrapes  = 46 // one a minute
	alertEvalTime = 45 * time.Minute
	alertJob      = "kube-system/ip-masq-agent-nft"
)

// alertNode is one node's agent in a state, scraped every minute; nil
// scrape: the target is down (up 0).
type alertNode struct {
	name   string
	scrape func(minute int) string
	fires  []string // the alerts it fires at alertEvalTime
}

// agentInState returns a scrape function for an agent in a state: setup
// prepares the config file and the kernel before the first sync; step, if
// set, changes something before the minute's turn of the loop.
func agentInState(t *testing.T, setup func(path string, k *nft.Fake), step func(minute int, path string, k *nft.Fake)) func(int) string {
	path := filepath.Join(t.TempDir(), "config")
	k := &nft.Fake{}
	setup(path, k)
	m := metrics.New("test", nil)
	a := agent.New(agent.Options{ConfigPath: path, NFT: nft.Options{Chain: nft.DefaultChain, RandomFully: true}, Original: &original.Fake{}},
		k, slog.New(slog.NewTextHandler(io.Discard, nil)), m)
	start := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	return func(minute int) string {
		if step != nil {
			step(minute, path, k)
		}
		now := start.Add(time.Duration(minute) * time.Minute)
		if minute == 0 {
			a.Sync(now)
		} else {
			a.Tick(now)
		}
		rec := httptest.NewRecorder()
		m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		return rec.Body.String()
	}
}

func writeConfigAt(t *testing.T, path, yaml string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestAlertRulesInEachState(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		reason := testnet.MissingReason("promtool")
		if os.Geteuid() == 0 || os.Getenv("CI") == "true" {
			t.Fatalf("%s: the alert rules cannot be evaluated", reason)
		}
		t.Skip(reason)
	}
	const good = "nonMasqueradeCIDRs: [10.0.0.0/8]\n"
	const bad = "nonMasqueradeCIDRs: [10.0.0.0/88]\n"
	nodes := []alertNode{
		{name: "node-good", scrape: agentInState(t, func(p string, _ *nft.Fake) { writeConfigAt(t, p, good) }, nil)},
		{name: "node-bad-config", fires: []string{"IPMasqAgentConfigNotApplied"},
			scrape: agentInState(t, func(p string, _ *nft.Fake) { writeConfigAt(t, p, good) }, func(minute int, p string, _ *nft.Fake) {
				if minute == 1 {
					writeConfigAt(t, p, bad)
				}
			})},
		// A node that joins while the ConfigMap is bad: no table, no
		// failed sync (docs/runbook.md).
		{name: "node-joined-bad", fires: []string{"IPMasqAgentConfigNotApplied"},
			scrape: agentInState(t, func(p string, _ *nft.Fake) { writeConfigAt(t, p, bad) }, nil)},
		{name: "node-waiting", fires: []string{"IPMasqAgentWaitingForOwner"},
			scrape: agentInState(t, func(p string, k *nft.Fake) {
				writeConfigAt(t, p, good)
				theirs := nft.Build(config.Default(config.Flags{}), nft.Options{Chain: nft.DefaultChain})
				theirs.Owner, theirs.Persist = nft.OwnedByOther, true
				k.Tamper("another agent", func(t **nft.Table) { *t = theirs.Clone() })
			}, nil)},
		{name: "node-failing", fires: []string{"IPMasqAgentSyncFailing"},
			scrape: agentInState(t, func(p string, k *nft.Fake) {
				writeConfigAt(t, p, good)
				k.SendErr = errors.New("netlink receive: invalid argument")
			}, nil)},
		{name: "node-down", fires: []string{"IPMasqAgentDown"}},
	}
	// Another config in force on one node, for 45 minutes: the nodes
	// with a config in force fire IPMasqAgentConfigsDiffer, each named.
	const other = "nonMasqueradeCIDRs: [10.0.0.0/8, 192.0.2.0/24]\n"
	differ := []alertNode{
		{name: "node-a", fires: []string{"IPMasqAgentConfigsDiffer"}, scrape: agentInState(t, func(p string, _ *nft.Fake) { writeConfigAt(t, p, good) }, nil)},
		{name: "node-b", fires: []string{"IPMasqAgentConfigsDiffer"}, scrape: agentInState(t, func(p string, _ *nft.Fake) { writeConfigAt(t, p, other) }, nil)},
		{name: "node-c", scrape: agentInState(t, func(p string, _ *nft.Fake) { writeConfigAt(t, p, bad) }, nil), fires: []string{"IPMasqAgentConfigNotApplied"}},
	}
	cases := []map[string]any{alertCase(t, nodes), alertCase(t, differ)}
	runPromtool(t, promtool, cases)
}

// samples turns a metric family into series names (with the target's
// labels) and their values.
func samples(f *dto.MetricFamily, target map[string]string) map[string]string {
	out := map[string]string{}
	name := f.GetName()
	num := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	for _, m := range f.GetMetric() {
		labels := maps.Clone(target)
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		switch f.GetType() {
		case dto.MetricType_COUNTER:
			out[seriesName(name, labels, nil)] = num(m.GetCounter().GetValue())
		case dto.MetricType_GAUGE:
			out[seriesName(name, labels, nil)] = num(m.GetGauge().GetValue())
		case dto.MetricType_UNTYPED:
			out[seriesName(name, labels, nil)] = num(m.GetUntyped().GetValue())
		case dto.MetricType_HISTOGRAM:
			h := m.GetHistogram()
			for _, b := range h.GetBucket() {
				out[seriesName(name+"_bucket", labels, map[string]string{"le": num(b.GetUpperBound())})] = strconv.FormatUint(b.GetCumulativeCount(), 10)
			}
			out[seriesName(name+"_bucket", labels, map[string]string{"le": "+Inf"})] = strconv.FormatUint(h.GetSampleCount(), 10)
			out[seriesName(name+"_sum", labels, nil)] = num(h.GetSampleSum())
			out[seriesName(name+"_count", labels, nil)] = strconv.FormatUint(h.GetSampleCount(), 10)
		}
	}
	return out
}

// seriesName is name{labels} in promtool's series notation, labels sorted.
func seriesName(name string, labels, more map[string]string) string {
	all := maps.Clone(labels)
	maps.Copy(all, more)
	keys := slices.Collect(maps.Keys(all))
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s=%q", k, all[k])
	}
	return name + "{" + b.String() + "}"
}

var templateRE = regexp.MustCompile(`\{\{.*?\}\}`)

// expandLabels renders an annotation's {{ $labels.X }} as Prometheus
// would; the shipped annotations of firing alerts use no other template.
func expandLabels(t *testing.T, alert, s string, labels map[string]string) string {
	return templateRE.ReplaceAllStringFunc(s, func(m string) string {
		if sub := labelRE.FindStringSubmatch(m); sub != nil {
			return labels[sub[1]]
		}
		t.Fatalf("%s: the test renders only {{ $labels.X }}, not %s", alert, m)
		return ""
	})
}

// alertCase is one promtool test case: the nodes' scrapes as input series,
// and, for every alert of the rule file, the alerts expected at
// alertEvalTime (none for an alert no node fires: promtool checks only the
// alerts it is given).
func alertCase(t *testing.T, nodes []alertNode) map[string]any {
	t.Helper()
	rf := readRuleFile(t)
	var alerts []string
	templates := map[string]map[string]string{}
	severity := map[string]string{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			templates[r.Alert] = r.Annotations
			severity[r.Alert] = r.Labels["severity"]
			if !strings.Contains(r.Annotations["summary"], "{{ $labels.node }}") {
				t.Errorf("%s: the summary does not name the node ({{ $labels.node }}): %q", r.Alert, r.Annotations["summary"])
			}
		}
	}
	for _, n := range nodes {
		for _, a := range n.fires {
			if !slices.Contains(alerts, a) {
				t.Fatalf("%s: no alert %s in the rule file", n.name, a)
			}
		}
	}

	// The scrapes as promtool's input series, with the target labels of
	// deploy/components/prometheus's PodMonitor.
	series := map[string][]string{} // series -> a value a minute ("_": none)
	hashes := map[string]string{}   // node -> the config_info hash of its last scrape
	targets := map[string]map[string]string{}
	for i, n := range nodes {
		target := map[string]string{
			"job": alertJob, "namespace": "kube-system", "node": n.name,
			"instance": fmt.Sprintf("192.0.2.%d:9753", 10+i), "pod": "ip-masq-agent-nft-" + strconv.Itoa(10000+i),
		}
		targets[n.name] = target
		up := "0"
		if n.scrape != nil {
			up = "1"
		}
		series[seriesName("up", target, nil)] = slices.Repeat([]string{up}, alertScrapes)
		if n.scrape == nil {
			continue
		}
		for minute := range alertScrapes {
			parser := expfmt.NewTextParser(model.UTF8Validation)
			fams, err := parser.TextToMetricFamilies(strings.NewReader(n.scrape(minute)))
			if err != nil {
				t.Fatalf("%s: the scrape does not parse: %v", n.name, err)
			}
			for name, f := range fams {
				if !strings.HasPrefix(name, "ip_masq_agent_") {
					continue
				}
				if name == "ip_masq_agent_config_info" && minute == alertScrapes-1 && len(f.GetMetric()) == 1 {
					hashes[n.name] = f.GetMetric()[0].GetLabel()[0].GetValue()
				}
				for s, v := range samples(f, target) {
					if series[s] == nil {
						series[s] = slices.Repeat([]string{"_"}, alertScrapes)
					}
					series[s][minute] = v
				}
			}
		}
	}
	for _, n := range nodes {
		// The waiting agent says so in its own metric.
		if !slices.Contains(n.fires, "IPMasqAgentWaitingForOwner") {
			continue
		}
		if v := series[seriesName("ip_masq_agent_waiting_for_owner", targets[n.name], nil)]; v == nil || v[alertScrapes-1] != "1" {
			t.Errorf("%s: ip_masq_agent_waiting_for_owner is %v, want 1", n.name, v)
		}
	}

	type expAlert struct {
		ExpLabels      map[string]string `json:"exp_labels"`
		ExpAnnotations map[string]string `json:"exp_annotations"`
	}
	type alertTest struct {
		EvalTime  string     `json:"eval_time"`
		Alertname string     `json:"alertname"`
		ExpAlerts []expAlert `json:"exp_alerts"`
	}
	var tests []alertTest
	// Labels an alert keeps from its expression beyond the target's.
	extra := map[string]map[string]string{"IPMasqAgentSyncFailing": {"result": "error"}}
	for _, a := range alerts {
		at := alertTest{EvalTime: alertEvalTime.String(), Alertname: a, ExpAlerts: []expAlert{}}
		for _, n := range nodes {
			if !slices.Contains(n.fires, a) {
				continue
			}
			labels := maps.Clone(targets[n.name])
			maps.Copy(labels, extra[a])
			if a == "IPMasqAgentConfigsDiffer" {
				labels["hash"] = hashes[n.name]
			}
			labels["severity"] = severity[a]
			ann := map[string]string{}
			for k, v := range templates[a] {
				ann[k] = expandLabels(t, a, v, labels)
			}
			at.ExpAlerts = append(at.ExpAlerts, expAlert{ExpLabels: labels, ExpAnnotations: ann})
		}
		tests = append(tests, at)
	}
	type inputSeries struct {
		Series string `json:"series"`
		Values string `json:"values"`
	}
	var in []inputSeries
	for _, s := range slices.Sorted(maps.Keys(series)) {
		in = append(in, inputSeries{s, strings.Join(series[s], " ")})
	}
	return map[string]any{"interval": "1m", "input_series": in, "alert_rule_test": tests}
}

// TestAlertRulesRealAgent: the same, with the real agent on the kernel in
// network namespaces: a good node, a second agent waiting for the first
// (the table's owner), a bad ConfigMap edit, and a node that joined with a
// bad ConfigMap. Each agent's /metrics is scraped twice, a few of its loop's
// turns apart (waited for in its log), and each series goes on at the rate
// between the two scrapes (counters) or stays (gauges) for the 45 minutes
// promtool evaluates: the rules see the real agent's names, labels and
// rates. Before the waiting state was a state of its own, the waiting agent
// counted a failed sync a second and fired IPMasqAgentSyncFailing.
func TestAlertRulesRealAgent(t *testing.T) {
	topo := newTopology(t)
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("%s: the alert rules cannot be evaluated", testnet.MissingReason("promtool"))
	}
	const good = "nonMasqueradeCIDRs: [10.0.0.0/8]\nresyncInterval: 1s\n"
	const bad = "nonMasqueradeCIDRs: [10.0.0.0/88]\nresyncInterval: 1s\n"

	// The node's agent, good; a second one waits for it to exit.
	cmA := newConfigMapDir(t, good)
	a := startDaemon(t, topo, "--config", cmA.path())
	eventually(t, "the first agent ready", func() bool { code, _ := httpGet(topo, "/readyz"); return code == 200 })
	owned := false
	if code, out, _ := runTool(t, topo, "list"); code == 0 {
		owned = strings.HasPrefix(out, "# owned")
	}
	b := startDaemon(t, topo, "--config", cmA.path(), "--http-address=127.0.0.1:9754")
	const looking = "is owned by another process; looking again in a second"
	waiting := alertNode{name: "node-waiting", fires: []string{"IPMasqAgentWaitingForOwner"}}
	if owned {
		if err := b.WaitCount(context.Background(), 20*time.Second, looking, 1); err != nil {
			t.Fatal(err)
		}
		waiting.scrape = realScrapes(t, topo, b, "http://127.0.0.1:9754/metrics", looking)
	} else {
		// A kernel before 6.9 cannot own the table: the second agent
		// finds it in sync and is as good as the first.
		t.Log("the kernel does not own the table (before 6.9): the second agent does not wait")
		waiting.fires = nil
		waiting.scrape = realScrapes(t, topo, b, "http://127.0.0.1:9754/metrics", "resync: the table read back is the wanted one")
	}
	goodNode := alertNode{name: "node-good", scrape: realScrapes(t, topo, a, harnessEndpoint+"/metrics", "resync: the table read back is the wanted one")}

	// A bad ConfigMap edit, on another node.
	topoC := newTopology(t)
	cmC := newConfigMapDir(t, good)
	c := startDaemon(t, topoC, "--config", cmC.path())
	eventually(t, "ready", func() bool { code, _ := httpGet(topoC, "/readyz"); return code == 200 })
	cmC.update(bad)
	if err := c.WaitCount(context.Background(), 20*time.Second, `msg="config not applied`, 1); err != nil {
		t.Fatal(err)
	}
	badNode := alertNode{name: "node-bad-config", fires: []string{"IPMasqAgentConfigNotApplied"},
		scrape: realScrapes(t, topoC, c, harnessEndpoint+"/metrics", `msg="config not applied`)}

	// A node that joins while the ConfigMap is bad.
	topoD := newTopology(t)
	cmD := newConfigMapDir(t, bad)
	dd := startDaemon(t, topoD, "--config", cmD.path())
	if err := dd.WaitCount(context.Background(), 20*time.Second, `msg="config not applied`, 1); err != nil {
		t.Fatal(err)
	}
	joined := alertNode{name: "node-joined-bad", fires: []string{"IPMasqAgentConfigNotApplied"},
		scrape: realScrapes(t, topoD, dd, harnessEndpoint+"/metrics", `msg="config not applied`)}

	cases := []map[string]any{alertCase(t, []alertNode{goodNode, waiting, badNode, joined})}
	runPromtool(t, promtool, cases)
}

const harnessEndpoint = "http://127.0.0.1:9753"

// realScrapes scrapes the agent's /metrics at url, waits for two more log
// lines with marker (turns of its loop), scrapes again, and returns the
// scrapes of the minutes promtool evaluates: each counter goes on at the
// rate between the two scrapes, each gauge stays as in the second.
func realScrapes(t *testing.T, topo *testnet.Topology, d *daemon, url, marker string) func(int) string {
	t.Helper()
	get := func() string {
		resp, err := topo.NodeHTTPClient().Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %d %v", url, resp.StatusCode, err)
		}
		return string(body)
	}
	eventually(t, url+" answers", func() bool {
		resp, err := topo.NodeHTTPClient().Get(url)
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})
	n := strings.Count(d.output(), marker)
	s0 := get()
	if err := d.WaitCount(context.Background(), 30*time.Second, marker, n+2); err != nil {
		t.Fatal(err)
	}
	s1 := get()
	return extrapolate(t, s0, s1)
}

// extrapolate returns the scrape of each minute m: s1's samples, a
// counter's value being v0 + m*(v1-v0).
func extrapolate(t *testing.T, s0, s1 string) func(int) string {
	t.Helper()
	types := map[string]string{}
	first := map[string]float64{}
	for _, l := range strings.Split(s0, "\n") {
		if k, v, ok := sampleLine(l); ok {
			first[k] = v
		}
	}
	type line struct {
		text    string // a comment, as it is
		key     string
		v0, v1  float64
		counter bool
	}
	var lines []line
	for _, l := range strings.Split(s1, "\n") {
		if f := strings.Fields(l); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			types[f[2]] = f[3]
		}
		k, v, ok := sampleLine(l)
		if !ok {
			lines = append(lines, line{text: l})
			continue
		}
		name, _, _ := strings.Cut(k, "{")
		counter := types[name] == "counter"
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && types[base] == "histogram" {
				counter = true
			}
		}
		v0, seen := first[k]
		if !seen {
			v0 = v
		}
		lines = append(lines, line{key: k, v0: v0, v1: v, counter: counter})
	}
	return func(m int) string {
		var b strings.Builder
		for _, l := range lines {
			switch {
			case l.key == "":
				b.WriteString(l.text)
			case l.counter:
				fmt.Fprintf(&b, "%s %s", l.key, strconv.FormatFloat(l.v0+float64(m)*(l.v1-l.v0), 'g', -1, 64))
			default:
				fmt.Fprintf(&b, "%s %s", l.key, strconv.FormatFloat(l.v1, 'g', -1, 64))
			}
			b.WriteByte('\n')
		}
		return b.String()
	}
}

// sampleLine splits a sample line of the text format into its series and
// value.
func sampleLine(l string) (string, float64, bool) {
	if l == "" || strings.HasPrefix(l, "#") {
		return "", 0, false
	}
	i := strings.LastIndexByte(l, ' ')
	if i < 0 {
		return "", 0, false
	}
	v, err := strconv.ParseFloat(l[i+1:], 64)
	if err != nil {
		return "", 0, false
	}
	return l[:i], v, true
}

// runPromtool writes the cases as a promtool rule test of the shipped rule
// file and runs it (ALERTS_TEST_KEEP=FILE keeps the file of a failure).
func runPromtool(t *testing.T, promtool string, cases []map[string]any) {
	t.Helper()
	abs, err := filepath.Abs(deployDir + "/prometheus/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	doc := map[string]any{
		"rule_files":          []string{abs},
		"evaluation_interval": "1m",
		"tests":               cases,
	}
	data, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "alerts_test.yaml")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(promtool, "test", "rules", file).CombinedOutput()
	if err != nil {
		t.Errorf("promtool test rules: %v\n%s", err, out)
		if os.Getenv("ALERTS_TEST_KEEP") != "" {
			os.WriteFile(os.Getenv("ALERTS_TEST_KEEP"), data, 0o644)
		}
	}
}

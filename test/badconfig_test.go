package test

import (
	"strings"
	"testing"
)

// The commonest incident, a bad ConfigMap edit: the agent keeps the last
// good table, says why, and the tools still answer from the kernel
// (docs/runbook.md, "The ConfigMap is bad").

const (
	badConfigGood = "nonMasqueradeCIDRs: [10.0.0.0/8]\n"
	badConfigBad  = "nonMasqueradeCIDRs: [10.0.0.0/88]\n"
)

// badConfigLineOK: the tool's one line on stderr names the file, the key
// and the value.
func badConfigLineOK(t *testing.T, tool, stderr, path string) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	var found []string
	for _, l := range lines {
		if strings.Contains(l, "config not applied") {
			found = append(found, l)
		}
	}
	if len(found) != 1 || !strings.Contains(found[0], path) || !strings.Contains(found[0], "nonMasqueradeCIDRs[0]") || !strings.Contains(found[0], `"10.0.0.0/88"`) {
		t.Errorf("%s: want one line naming %s, nonMasqueradeCIDRs[0] and \"10.0.0.0/88\"; stderr:\n%s", tool, path, stderr)
	}
}

// TestBadConfigToolsAnswerFromTheKernel: with a bad config, explain --live
// says so and still says what the kernel does for each address (what
// packets show), exit 3; diff says the table is kept, exit 3; list works.
// Back to a good config, the agent logs it and is ready again.
func TestBadConfigToolsAnswerFromTheKernel(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, internet1, private1)
	cm := newConfigMapDir(t, badConfigGood)
	d := startDaemon(t, topo, "--config", cm.path())
	eventually(t, "ready", func() bool { code, _ := httpGet(topo, "/readyz"); return code == 200 })

	cm.update(badConfigBad)
	eventually(t, "the refusal", func() bool { return strings.Contains(d.output(), `msg="config not applied`) })
	if code, body := httpGet(topo, "/readyz"); code != 503 || !strings.HasPrefix(body, "config not applied: ") || !strings.Contains(body, `"10.0.0.0/88"`) {
		t.Errorf("/readyz during a bad config: %d %q", code, body)
	}
	expectSources(t, topo, map[string]bool{internet1: true, private1: false})

	code, out, stderr := runTool(t, topo, "explain", "--live", "--config", cm.path(), private1, internet1)
	if code != 3 {
		t.Errorf("explain --live with a bad config: exit %d, want 3\n%s%s", code, out, stderr)
	}
	badConfigLineOK(t, "explain --live", stderr, cm.path())
	for _, want := range []string{
		private1 + "\n  config: bad, not applied (see the line on stderr)\n  kernel: not masqueraded: set nonmasq-v4 holds 10.0.0.0/8",
		internet1 + "\n  config: bad, not applied (see the line on stderr)\n  kernel: masquerade: ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("explain --live with a bad config lacks %q:\n%s", want, out)
		}
	}
	// Without --live there is no answer but the error.
	if code, out, stderr := runTool(t, topo, "explain", "--config", cm.path(), private1); code != 2 || out != "" {
		t.Errorf("explain with a bad config: exit %d %q %s", code, out, stderr)
	}
	code, out, stderr = runTool(t, topo, "diff", "--config", cm.path())
	if code != 3 || out != "table inet ip-masq-agent kept as it is while the config is bad (ip-masq-agent list prints it)\n" {
		t.Errorf("diff with a bad config: exit %d %q %s", code, out, stderr)
	}
	badConfigLineOK(t, "diff", stderr, cm.path())
	if code, out, stderr := runTool(t, topo, "list"); code != 0 || !strings.Contains(out, "10.0.0.0/8") {
		t.Errorf("list during a bad config: exit %d %s%s", code, out, stderr)
	}

	// Back to the good config (the very one in force: nothing to send).
	cm.update(badConfigGood)
	eventually(t, "the recovery line", func() bool { return strings.Contains(d.output(), `level=INFO msg="config is good again; applied"`) })
	eventually(t, "ready again", func() bool { code, _ := httpGet(topo, "/readyz"); return code == 200 })
	log := d.output()
	if strings.LastIndex(log, "config is good again") < strings.LastIndex(log, "config not applied") {
		t.Errorf("the last word is the refusal:\n%s", log)
	}
}

// TestBadConfigAtJoin: a node that joins while the ConfigMap is bad. Its
// agent finds no table and has no last good config: it writes nothing, so
// the node's pods leave with their own addresses (nothing masquerades
// them); /readyz says "no config applied yet: <error>", /healthz stays
// good, no sync failure is counted; explain --live says the table does not
// exist. Fixed, the config is applied. docs/runbook.md and
// docs/configuration.md say this.
func TestBadConfigAtJoin(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, internet1, private1)
	cm := newConfigMapDir(t, badConfigBad)
	d := startDaemon(t, topo, "--config", cm.path())
	eventually(t, "the refusal", func() bool { return strings.Contains(d.output(), `msg="config not applied`) })
	// The HTTP server may start after the refusal is logged.
	eventually(t, "the HTTP server", func() bool { return strings.Contains(d.output(), `msg="serving /metrics, /healthz and /readyz"`) })
	if code, body := httpGet(topo, "/readyz"); code != 503 || !strings.HasPrefix(body, "no config applied yet: ") || !strings.Contains(body, `"10.0.0.0/88"`) {
		t.Errorf("/readyz: %d %q", code, body)
	}
	if code, body := httpGet(topo, "/healthz"); code != 200 {
		t.Errorf("/healthz: %d %q", code, body)
	}
	if code, out, stderr := runTool(t, topo, "list"); code != 1 || !strings.Contains(stderr, "does not exist") {
		t.Errorf("list: exit %d %s%s", code, out, stderr)
	}
	expectSources(t, topo, map[string]bool{internet1: false, private1: false})
	code, out, stderr := runTool(t, topo, "explain", "--live", "--config", cm.path(), internet1)
	if code != 3 || !strings.Contains(out, "kernel: not masqueraded: table inet ip-masq-agent does not exist") {
		t.Errorf("explain --live: exit %d\n%s%s", code, out, stderr)
	}
	badConfigLineOK(t, "explain --live", stderr, cm.path())
	code, out, stderr = runTool(t, topo, "diff", "--config", cm.path())
	if code != 3 || out != "table inet ip-masq-agent missing: the agent creates none while the config is bad\n" {
		t.Errorf("diff: exit %d %q %s", code, out, stderr)
	}
	_, metrics := httpGet(topo, "/metrics")
	for _, want := range []string{`ip_masq_agent_syncs_total{result="error"} 0`, "ip_masq_agent_config_last_reload_successful 0"} {
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	cm.update(badConfigGood)
	eventually(t, "the fixed config", sourcesAre(topo, map[string]bool{internet1: true, private1: false}))
	eventually(t, "ready", func() bool { code, _ := httpGet(topo, "/readyz"); return code == 200 })
}

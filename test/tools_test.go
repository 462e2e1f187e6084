package test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
)

// runTool runs `ip-masq-agent args...` in the node namespace and returns
// its exit code, standard output and standard error apart.
func runTool(t *testing.T, topo *testnet.Topology, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", topo.NodeNS, agentBin}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return exit.ExitCode(), stdout.String(), stderr.String()
	case err != nil:
		t.Fatalf("ip-masq-agent %s: %v", strings.Join(args, " "), err)
	}
	return 0, stdout.String(), stderr.String()
}

// TestToolsRenderLoadsAsTheDaemonPrograms: `render` output is accepted by
// `nft -c -f -`, and loaded with `nft -f` (twice: it replaces the table)
// it lists exactly as the table the daemon programs with the same config
// and flags.
func TestToolsRenderLoadsAsTheDaemonPrograms(t *testing.T) {
	testnet.Require(t, "ip", "nft", "sh")
	topo := newTopology(t)
	for _, tc := range []struct {
		name, config string
		flags        []string
	}{
		{"defaults", "", nil},
		{"reserved ranges", "", []string{"--nomasq-all-reserved-ranges"}},
		{"cce with ipv6", "nonMasqueradeCIDRs: [10.0.0.0/8, 172.16.0.0/12, \"fc00::/7\", 240.0.0.0/4]\nmasqueradeCIDRs: [10.10.10.10/32, \"::/0\"]\nmasqOutBound: false\n",
			[]string{"--enable-ipv6", "--masq-chain", "MY-CHAIN"}},
		{"to-ports", "nonMasqueradeCIDRs: [203.0.113.0/24, 198.51.100.7/32]\nmasqLinkLocal: true\n",
			[]string{"--to-ports", "1024-29999,32768-65535", "--random-fully=false"}},
		// Merged elements: a prefix and ranges that are no prefix, IPv6 too.
		{"merged and mostSpecific", "cidrMatch: mostSpecific\nnonMasqueradeCIDRs: [10.0.0.0/8, 10.20.30.0/24, 10.30.0.0/24, 10.30.1.0/24, 10.30.2.0/24, \"fd00::/8\", \"fd00:1::/48\"]\nmasqueradeCIDRs: [10.20.0.0/16, 169.254.169.254/32, \"fd00::/32\"]\n",
			[]string{"--enable-ipv6"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeConfig(t, tc.config)
			code, rendered, stderr := runTool(t, topo, append([]string{"render", "--config", path}, tc.flags...)...)
			if code != 0 {
				t.Fatalf("render: exit %d: %s", code, stderr)
			}
			file := filepath.Join(t.TempDir(), "ruleset.nft")
			if err := os.WriteFile(file, []byte(rendered), 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := testnet.Exec(topo.ExtNS, "sh", "-c", "nft -c -f - < "+file); err != nil {
				t.Fatalf("nft -c -f - rejects render's output: %v\n%s\n%s", err, out, rendered)
			}
			for i := 0; i < 2; i++ {
				if out, err := testnet.Exec(topo.ExtNS, "nft", "-f", file); err != nil {
					t.Fatalf("nft -f (load %d): %v\n%s", i+1, err, out)
				}
			}
			loaded, err := testnet.Exec(topo.ExtNS, "nft", "list", "table", "inet", "ip-masq-agent")
			if err != nil {
				t.Fatal(err)
			}
			mustApply(t, topo, tc.config, tc.flags...)
			if got, want := withoutCounters(listTable(t, topo)), withoutCounters(string(loaded)); got != want {
				t.Errorf("the daemon's table:\n%s\nrender's, loaded with nft -f:\n%s", got, want)
			}
			// And diff finds the daemon's table in sync with the same flags.
			if code, out, stderr := runTool(t, topo, append([]string{"diff", "--config", path}, tc.flags...)...); code != 0 || out != "in sync\n" {
				t.Errorf("diff after the daemon's apply: exit %d, %q %s", code, out, stderr)
			}
		})
	}
}

// explainVerdicts runs explain and returns each address's verdict.
func explainVerdicts(t *testing.T, topo *testnet.Topology, args ...string) map[string]string {
	t.Helper()
	code, out, stderr := runTool(t, topo, append([]string{"explain"}, args...)...)
	if code != 0 {
		t.Fatalf("explain: exit %d: %s%s", code, out, stderr)
	}
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 3 && f[1] == "masquerade":
			got[f[0]] = "masquerade"
		case len(f) >= 4 && f[1] == "not" && f[2] == "masqueraded":
			got[f[0]] = "not masqueraded"
		default:
			t.Fatalf("explain printed %q", line)
		}
	}
	return got
}

// TestToolsExplainAgreesWithPackets: for several configs, explain's
// verdict for each destination is what packets show, and explain --live
// agrees with the config.
func TestToolsExplainAgreesWithPackets(t *testing.T) {
	topo := newTopology(t)
	dsts := []string{internet1, internet2, internet3, private1, private2, linkLocal, internet6a, internet6b, private6}
	addDestinations(t, topo, dsts...)
	for _, tc := range []struct {
		name, config string
		flags        []string
	}{
		{"defaults", "", nil},
		{"lists", "nonMasqueradeCIDRs: [10.250.0.0/16, 203.0.113.0/24]\nmasqueradeCIDRs: [10.250.0.11/32]\nmasqLinkLocal: true\n", nil},
		{"masqOutBound false", "masqueradeCIDRs: [198.51.100.0/24, 10.250.0.10/32]\nmasqOutBound: false\n", nil},
		{"ipv6", "nonMasqueradeCIDRs: [\"fd00::/8\", 192.0.2.0/24]\nmasqueradeCIDRs: [\"2001:db8:bb::/48\"]\n", []string{"--enable-ipv6"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeConfig(t, tc.config)
			mustApply(t, topo, tc.config, tc.flags...)
			verdicts := explainVerdicts(t, topo, append(append([]string{"--config", path}, tc.flags...), dsts...)...)
			want := map[string]bool{}
			for _, d := range dsts {
				want[d] = verdicts[d] == "masquerade"
			}
			expectSources(t, topo, want)
			code, out, stderr := runTool(t, topo, append(append([]string{"explain", "--live", "--config", path}, tc.flags...), dsts...)...)
			if code != 0 || strings.Contains(out, "DISAGREE") {
				t.Errorf("explain --live: exit %d\n%s%s", code, out, stderr)
			}
			if t.Failed() {
				t.Logf("explain: %v\ntable:\n%s", verdicts, listTable(t, topo))
			}
		})
	}
}

// TestToolsExplainLiveTampered: a rule inserted by someone else makes the
// kernel masquerade a destination the config does not: explain --live says
// DISAGREE (exit 1), its kernel verdict is what packets show, and diff
// names the foreign rule.
func TestToolsExplainLiveTampered(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, private1, private2, internet1)
	path := writeConfig(t, "")
	mustApply(t, topo, "")
	if out, err := topo.NFT("insert", "rule", "inet", "ip-masq-agent", "IP-MASQ-AGENT", "ip", "daddr", private1, "goto", "masq-to-node"); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	code, out, stderr := runTool(t, topo, "explain", "--live", "--config", path, private1, private2)
	if code != 1 || strings.Count(out, "DISAGREE") != 1 {
		t.Fatalf("explain --live: exit %d, want 1 and one DISAGREE\n%s%s", code, out, stderr)
	}
	block := out[:strings.Index(out, private2+"\n")]
	for _, want := range []string{"config: not masqueraded: nonMasqueradeCIDRs[0] 10.0.0.0/8 (the default list)", "kernel: masquerade: chain IP-MASQ-AGENT rule 1",
		"rule: meta nfproto ipv4 ip daddr " + private1 + " goto masq-to-node", "DISAGREE"} {
		if !strings.Contains(block, want) {
			t.Errorf("explain --live for %s lacks %q:\n%s", private1, want, block)
		}
	}
	expectSources(t, topo, map[string]bool{private1: true, private2: false})

	code, out, _ = runTool(t, topo, "diff", "--config", path)
	if code != 1 || !strings.HasPrefix(out, "flush chain inet ip-masq-agent IP-MASQ-AGENT\n") || strings.Count(out, "add rule") != 3 {
		t.Errorf("diff: exit %d\n%s", code, out)
	}
}

// TestToolsDiff: in sync gives exit 0; an element added by someone else,
// a config that changed, and a missing table each give exit 1 and say so.
func TestToolsDiff(t *testing.T) {
	topo := newTopology(t)
	cfg := "nonMasqueradeCIDRs: [10.0.0.0/8, 192.168.0.0/16]\n"
	path := writeConfig(t, cfg)
	mustApply(t, topo, cfg)
	diff := func() (int, string) {
		t.Helper()
		code, out, stderr := runTool(t, topo, "diff", "--config", path)
		if code == 2 {
			t.Fatalf("diff: %s", stderr)
		}
		return code, out
	}
	if code, out := diff(); code != 0 || out != "in sync\n" {
		t.Fatalf("diff after apply: exit %d %q", code, out)
	}
	if out, err := topo.NFT("add", "element", "inet", "ip-masq-agent", "nonmasq-v4", "{ 203.0.113.0/24 }"); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	if code, out := diff(); code != 1 || out != "delete element inet ip-masq-agent nonmasq-v4 { 203.0.113.0/24 }\n" {
		t.Errorf("diff after nft add element: exit %d %q", code, out)
	}
	mustApply(t, topo, cfg)
	if err := os.WriteFile(path, []byte("nonMasqueradeCIDRs: [10.0.0.0/8, 198.51.100.0/24]\nmasqOutBound: false\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out := diff()
	if code != 1 || !strings.Contains(out, "delete element inet ip-masq-agent nonmasq-v4 { 192.168.0.0/16 }\nadd element inet ip-masq-agent nonmasq-v4 { 198.51.100.0/24 }\n") ||
		!strings.HasPrefix(out, "flush chain inet ip-masq-agent IP-MASQ-AGENT\n") || strings.Count(out, "add rule") != 2 {
		t.Errorf("diff after a config change: exit %d\n%s", code, out)
	}
	if out, err := topo.NFT("delete", "table", "inet", "ip-masq-agent"); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	if code, out := diff(); code != 1 || out != "table inet ip-masq-agent missing: the agent would create it\n" {
		t.Errorf("diff without the table: exit %d %q", code, out)
	}
}

// TestToolsConfigDirectory: --config DIR merges a platform file and a
// user file of a projected volume; when the user file goes bad, the
// daemon names it, keeps its last good CIDRs in force and still applies
// the platform file's changes; the tools read the directory the same way.
func TestToolsConfigDirectory(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, internet1, internet2, internet3, private1)
	cm := newProjectedDir(t, map[string]string{
		"ip-masq-agent":            "nonMasqueradeCIDRs: [10.0.0.0/8]\n",
		"ip-masq-agent-reconciled": "nonMasqueradeCIDRs: [203.0.113.0/24]\n",
	})
	d := startDaemon(t, topo, "--config", cm.Dir, "--http-address=127.0.0.1:0", "--resync-interval=3600")
	eventually(t, "the merged config", sourcesAre(topo, map[string]bool{private1: false, internet1: false, internet2: true, internet3: true}))
	if code, out, stderr := runTool(t, topo, "diff", "--config", cm.Dir); code != 0 || out != "in sync\n" {
		t.Errorf("diff --config DIR: exit %d %q %s", code, out, stderr)
	}
	if v := explainVerdicts(t, topo, "--config", cm.Dir, internet1, internet2); v[internet1] != "not masqueraded" || v[internet2] != "masquerade" {
		t.Errorf("explain --config DIR: %v", v)
	}

	// The user's file goes bad: named in the log, its CIDRs stay.
	cm.updateFiles(map[string]string{"ip-masq-agent-reconciled": "nonMasqueradeCIDRs: [203.0.113.1/24]\n"})
	bad := filepath.Join(cm.Dir, "ip-masq-agent-reconciled")
	eventually(t, "the bad file to be named in the log", func() bool { return strings.Contains(d.output(), bad+": nonMasqueradeCIDRs[0]") })
	expectSources(t, topo, map[string]bool{private1: false, internet1: false, internet2: true})

	// The platform's file changes meanwhile: applied, with the user's
	// last good CIDRs.
	cm.updateFiles(map[string]string{"ip-masq-agent": "nonMasqueradeCIDRs: [10.0.0.0/8, 198.51.100.0/24]\n"})
	eventually(t, "the platform's change", sourcesAre(topo, map[string]bool{internet2: false}))
	expectSources(t, topo, map[string]bool{private1: false, internet1: false, internet2: false, internet3: true})

	// Tools fail on the bad file (they have no last good content).
	if code, _, stderr := runTool(t, topo, "render", "--config", cm.Dir); code != 2 || !strings.Contains(stderr, bad) {
		t.Errorf("render with a bad file: exit %d %q", code, stderr)
	}
	if code, out, _ := runTool(t, topo, "validate", cm.Dir); code != 1 || !strings.HasPrefix(out, bad+":1: nonMasqueradeCIDRs[0]") {
		t.Errorf("validate DIR: exit %d %q", code, out)
	}

	// Fixed: the user's new CIDRs replace the old.
	cm.updateFiles(map[string]string{"ip-masq-agent-reconciled": "nonMasqueradeCIDRs: [192.0.2.0/24]\n"})
	eventually(t, "the fixed file", sourcesAre(topo, map[string]bool{internet1: true, internet3: false}))
	if n := strings.Count(d.output(), "level=ERROR"); n != 1 {
		t.Errorf("%d error lines for one bad file, want 1:\n%s", n, d.output())
	}
}

// TestToolsValidateManifests: validate in CI, on manifests as kept in Git.
func TestToolsValidateManifests(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	good := write("good.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ip-masq-agent\ndata:\n  config: |\n    nonMasqueradeCIDRs: [10.0.0.0/8]\n")
	typo := write("typo.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ip-masq-agent\ndata:\n  config: |\n    nonMasqueradeCIDRs: [10.0.0.0/8]\n    masqLinkLocl: true\n")
	ds := write("ds.yaml", "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: x\n")
	run := func(args ...string) (int, string, string) {
		cmd := exec.Command(agentBin, append([]string{"validate"}, args...)...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return exit.ExitCode(), stdout.String(), stderr.String()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0, stdout.String(), stderr.String()
	}
	if code, out, stderr := run(good, typo, ds); code != 0 || out != typo+`:8: masqLinkLocl: unknown key ignored (did you mean "masqLinkLocal"?) (warning)`+"\n" ||
		!strings.Contains(stderr, ds+": not checked") {
		t.Errorf("validate: exit %d %q %q", code, out, stderr)
	}
	if code, out, _ := run("--strict", good, typo, ds); code != 1 || !strings.HasPrefix(out, typo+":8: masqLinkLocl: unknown key") {
		t.Errorf("validate --strict: exit %d %q", code, out)
	}
	// The repository's own example ConfigMap is valid, strictly (and
	// there: a missing file fails validate, and this test).
	if code, out, stderr := run("--strict", "../deploy/examples/configmap.yaml"); code != 0 {
		t.Errorf("deploy/examples/configmap.yaml: exit %d %s%s", code, out, stderr)
	}
}

// TestToolsListMatchesNFT: `ip-masq-agent list` (the agent's own reader)
// and `nft list table` describe the same table, counters included: list's
// output, loaded with nft -f elsewhere, lists exactly as the original.
func TestToolsListMatchesNFT(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, internet1, private1)
	mustApply(t, topo, "nonMasqueradeCIDRs: [10.0.0.0/8, 192.168.0.0/16, \"fd00::/8\"]\nmasqueradeCIDRs: [10.250.0.10/32]\n",
		"--enable-ipv6", "--to-ports", "1024-29999,32768-65535")
	expectSources(t, topo, map[string]bool{internet1: true, private1: true})
	code, out, stderr := runTool(t, topo, "list")
	if code != 0 {
		t.Fatalf("list: exit %d: %s", code, stderr)
	}
	file := writeConfig(t, out)
	if out, err := testnet.Exec(topo.ExtNS, "nft", "-f", file); err != nil {
		t.Fatalf("nft -f rejects list's output: %v\n%s", err, out)
	}
	loaded, err := testnet.Exec(topo.ExtNS, "nft", "list", "table", "inet", "ip-masq-agent")
	if err != nil {
		t.Fatal(err)
	}
	strip := func(s string) string { return tableFlagsRE.ReplaceAllString(s, "") }
	if got, want := strip(string(loaded)), strip(listTable(t, topo)); got != want {
		t.Errorf("list's table, loaded with nft -f:\n%s\nnft list of the node:\n%s", got, want)
	}
	if !strings.Contains(out, "counter packets 1 ") {
		t.Errorf("list shows no counted packet:\n%s", out)
	}
	if code, _, _ := runTool(t, newTopology(t), "list"); code != 1 {
		t.Errorf("list without a table: exit %d, want 1", code)
	}
}

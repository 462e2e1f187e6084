package config

import (
	"strings"
	"testing"
)

// TestManifestList: a kind: List (or a kind ending in List) stands for its
// items: their kinds are reported, a ConfigMap among them is checked with
// lines pointing into the file, and the tools read its config.
func TestManifestList(t *testing.T) {
	list := `apiVersion: v1
kind: List
items:
- apiVersion: apps/v1
  kind: DaemonSet
  metadata: {name: ip-masq-agent}
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: ip-masq-agent}
  data:
    config: |
      nonMasqueradeCIDRs:
        - 10.0.0.0/88
`
	if k := Kinds([]byte(list)); strings.Join(k, ",") != "DaemonSet,ConfigMap" {
		t.Errorf("Kinds of a List: %v, want its items' DaemonSet,ConfigMap", k)
	}
	wantProblems(t, problems(list, v4Only, false),
		`13: nonMasqueradeCIDRs[0]: "10.0.0.0/88" is not a valid CIDR: prefix length out of range`)
	cfg, isManifest, err := FromManifest([]byte(list))
	if err != nil || !isManifest || !strings.Contains(string(cfg), "10.0.0.0/88") {
		t.Errorf("FromManifest of a List: %q %v %v", cfg, isManifest, err)
	}
}

// TestManifestMountedKey: a ConfigMap whose config is only under a key
// named ip-masq... (Azure's) is a warning (an error with strict): the
// shipped DaemonSet mounts only the key config. The tools still read it.
func TestManifestMountedKey(t *testing.T) {
	azure := "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata:\n  ip-masq-agent: |\n    nonMasqueradeCIDRs: [10.0.0.0/8]\n"
	const msg = `4: ConfigMap "x" has no data key "config", the only key the shipped DaemonSet mounts (deploy/daemonset.yaml): ` +
		`with it the agent would run the defaults; keys named ip-masq... are read only where the whole ConfigMap is mounted as a directory (Azure ip-masq-agent-v2)`
	wantProblems(t, problems(azure, v4Only, false), msg+" (warning)")
	wantProblems(t, problems(azure, v4Only, true), msg)
	if cfg, _, err := FromManifest([]byte(azure)); err != nil || !strings.Contains(string(cfg), "10.0.0.0/8") {
		t.Errorf("FromManifest: %q %v", cfg, err)
	}
	wantProblems(t, problems("apiVersion: v1\nkind: ConfigMap\ndata:\n  config: |\n    nonMasqueradeCIDRs: [10.0.0.0/8]\n", v4Only, true))
}

// TestManifestMountedName: the shipped DaemonSet mounts ConfigMap
// kube-system/ip-masq-agent (optional): a ConfigMap with the key config
// under another name or namespace leaves the agent on the defaults. A
// warning (an error with strict); none without a name or namespace.
func TestManifestMountedName(t *testing.T) {
	cm := func(meta string) string {
		return "apiVersion: v1\nkind: ConfigMap\nmetadata: " + meta + "\ndata:\n  config: |\n    nonMasqueradeCIDRs: [10.0.0.0/8]\n"
	}
	const msg = `3: ConfigMap %s is not the one the shipped DaemonSet mounts (deploy/daemonset.yaml: kube-system/ip-masq-agent, optional): with it the agent would run the defaults`
	wantProblems(t, problems(cm("{name: ip-masq-agnet, namespace: kube-system}"), v4Only, false), fmtS(msg, `"ip-masq-agnet"`)+" (warning)")
	wantProblems(t, problems(cm("{name: ip-masq-agnet}"), v4Only, true), fmtS(msg, `"ip-masq-agnet"`))
	wantProblems(t, problems(cm("{name: ip-masq-agent, namespace: default}"), v4Only, true), fmtS(msg, `"default/ip-masq-agent"`))
	wantProblems(t, problems(cm("{name: ip-masq-agent, namespace: kube-system}"), v4Only, true))
	wantProblems(t, problems(cm("{name: ip-masq-agent}"), v4Only, true))
}

func fmtS(format, s string) string { return strings.Replace(format, "%s", s, 1) }

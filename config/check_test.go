package config

import (
	"fmt"
	"strings"
	"testing"
)

// problems renders Check's result as "LINE: key: message[ (warning)]".
func problems(data string, f Flags, strict bool) []string {
	var out []string
	for _, p := range Check([]byte(data), f, strict) {
		s := p.String()
		if p.Warning {
			s += " (warning)"
		}
		out = append(out, s)
	}
	return out
}

func wantProblems(t *testing.T, got []string, want ...string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestCheckYAML(t *testing.T) {
	doc := `# a comment
nonMasqueradeCIDRs:
  - 10.0.0.0/8
  - 10.0.0.1/8      # misaligned
  - "fc00::/7"
masqLinkLocl: true
MasqOutBound: false
resyncInterval: 100ms
masqueradeCIDRs: [10.10.10.10/32, x]
`
	wantProblems(t, problems(doc, v4Only, false),
		`4: nonMasqueradeCIDRs[1]: "10.0.0.1/8" is not aligned to its prefix length (did you mean "10.0.0.0/8"?)`,
		`5: nonMasqueradeCIDRs[2]: "fc00::/7" is an IPv6 CIDR; pass --enable-ipv6 to use IPv6`,
		`6: masqLinkLocl: unknown key ignored (did you mean "masqLinkLocal"?) (warning)`,
		`7: MasqOutBound: read as "masqOutBound"; please spell it exactly (warning)`,
		`8: resyncInterval: "100ms" is below the minimum of 1s; using 1s (warning)`,
		`9: masqueradeCIDRs[1]: "x" is not a valid CIDR: missing the prefix length ("/N")`,
	)
	// --strict: the warnings are errors.
	wantProblems(t, problems(doc, v6, true),
		`4: nonMasqueradeCIDRs[1]: "10.0.0.1/8" is not aligned to its prefix length (did you mean "10.0.0.0/8"?)`,
		`6: masqLinkLocl: unknown key (did you mean "masqLinkLocal"?)`,
		`7: MasqOutBound: read as "masqOutBound"; please spell it exactly`,
		`8: resyncInterval: "100ms" is below the minimum of 1s; using 1s`,
		`9: masqueradeCIDRs[1]: "x" is not a valid CIDR: missing the prefix length ("/N")`,
	)
}

func TestCheckValid(t *testing.T) {
	for _, doc := range []string{"", "\n\n", "nonMasqueradeCIDRs: [10.0.0.0/8]\n", `{"masqLinkLocal": true}`} {
		if got := problems(doc, v4Only, true); len(got) != 0 {
			t.Errorf("Check(%q) = %q, want none", doc, got)
		}
	}
}

func TestCheckJSON(t *testing.T) {
	doc := `{
  "nonMasqueradeCIDRs": [
    "10.0.0.0/8",
    "10.0.0.1/8"
  ],
  "masqLinkLocal": "yes",
  "resyncIntreval": "1s"
}`
	wantProblems(t, problems(doc, v4Only, false),
		`4: nonMasqueradeCIDRs[1]: "10.0.0.1/8" is not aligned to its prefix length (did you mean "10.0.0.0/8"?)`,
		`6: masqLinkLocal: expected true or false, got string "yes"`,
		`7: resyncIntreval: unknown key ignored (did you mean "resyncInterval"?) (warning)`,
	)
}

func TestCheckDocumentProblems(t *testing.T) {
	wantProblems(t, problems("masqLinkLocal: true\n\nnonMasqueradeCIDRs: [10.0.0.0/8\n", v4Only, false),
		`3: cannot parse YAML/JSON: yaml: line 3: did not find expected ',' or ']'`)
	wantProblems(t, problems("a: 1\nmasqLinkLocal: true\nmasqLinkLocal: false\n", v4Only, false),
		`1: a: unknown key ignored (warning)`,
		`2: masqLinkLocal: given more than once (keys match case-insensitively); the value of the last one read, "masqLinkLocal", is used, as in the original agent (warning)`)
	wantProblems(t, problems("- 10.0.0.0/8\n", v4Only, false),
		`1: the document must be a mapping of keys to values, got list ["10.0.0.0/8"]`)
	wantProblems(t, problems("nonMasqueradeCIDRs: []\nnonMasqueradeCidrs: []\n", v4Only, false),
		`2: nonMasqueradeCidrs: read as "nonMasqueradeCIDRs"; please spell it exactly (warning)`,
		`2: nonMasqueradeCidrs: given more than once (keys match case-insensitively); the value of the last one read, "nonMasqueradeCidrs", is used, as in the original agent (warning)`)
	// The defaults exceed a small cidrLimit: reported at cidrLimit.
	wantProblems(t, problems("masqOutBound: true\ncidrLimit: 2\n", v4Only, false),
		`2: nonMasqueradeCIDRs: 3 CIDRs (the defaults) exceed cidrLimit 2`)
	wantProblems(t, problems("cidrLimit: 1\nnonMasqueradeCIDRs:\n- 10.0.0.0/8\n- 11.0.0.0/8\n", v4Only, false),
		`2: nonMasqueradeCIDRs: 2 CIDRs exceed cidrLimit 1`)
	// egressInterfaces is bounded by cidrLimit too.
	wantProblems(t, problems("cidrLimit: 3\nnonMasqueradeCIDRs: [10.0.0.0/8]\negressInterfaces: [eth0, eth1, eth2, eth3]\n", v4Only, false),
		`3: egressInterfaces: `+msgOwnExtension+` (warning)`,
		`3: egressInterfaces: 4 interface names exceed cidrLimit 3`)
}

func TestCheckStrictShadowed(t *testing.T) {
	doc := `nonMasqueradeCIDRs:
- 10.1.0.0/16
- 10.0.0.0/8
- 192.168.0.0/16
- 10.0.0.0/8
- 192.168.1.0/24
- 172.16.5.0/24
masqueradeCIDRs:
- 172.16.0.0/12
- 172.16.0.0/16
`
	// The agent accepts it with only the note that the original agent
	// ignores masqueradeCIDRs.
	wantProblems(t, problems(doc, v4Only, false), `8: masqueradeCIDRs: `+msgExtension+` (warning)`)
	wantProblems(t, problems(doc, v4Only, true),
		`2: nonMasqueradeCIDRs[0]: "10.1.0.0/16" is contained in nonMasqueradeCIDRs[1] "10.0.0.0/8", so it has no effect`,
		`5: nonMasqueradeCIDRs[3]: "10.0.0.0/8" duplicates nonMasqueradeCIDRs[1] "10.0.0.0/8", so it has no effect`,
		`6: nonMasqueradeCIDRs[4]: "192.168.1.0/24" is contained in nonMasqueradeCIDRs[2] "192.168.0.0/16", so it has no effect`,
		`7: nonMasqueradeCIDRs[5]: "172.16.5.0/24" is inside masqueradeCIDRs[0] "172.16.0.0/12", which wins, so it has no effect`,
		`8: masqueradeCIDRs: `+msgExtension,
		`10: masqueradeCIDRs[1]: "172.16.0.0/16" is contained in masqueradeCIDRs[0] "172.16.0.0/12", so it has no effect`,
	)
	// IPv4-mapped entries are compared once unmapped; IPv6 too.
	wantProblems(t, problems("nonMasqueradeCIDRs: [\"::ffff:10.0.0.0/104\", 10.2.0.0/16, \"fd00::/8\", \"fd00:1::/32\"]\n", v6, true),
		`1: nonMasqueradeCIDRs[0]: "::ffff:10.0.0.0/104" is an IPv4-mapped IPv6 CIDR; read as "10.0.0.0/8"`,
		`1: nonMasqueradeCIDRs[1]: "10.2.0.0/16" is contained in nonMasqueradeCIDRs[0] "10.0.0.0/8", so it has no effect`,
		`1: nonMasqueradeCIDRs[3]: "fd00:1::/32" is contained in nonMasqueradeCIDRs[2] "fd00::/8", so it has no effect`,
	)
}

// An egressInterfaces entry that another already matches (a duplicate, a
// name or narrower wildcard beside a wildcard) has no effect: --strict says so.
func TestCheckStrictShadowedNames(t *testing.T) {
	doc := "egressInterfaces:\n- eth0\n- \"eth*\"\n- ens5\n- ens5\n- \"eth1*\"\n- \"ens*\"\n- \"ens*\"\n"
	wantProblems(t, problems(doc, v4Only, true),
		`1: egressInterfaces: `+msgOwnExtension,
		`2: egressInterfaces[0]: "eth0" is matched by egressInterfaces[1] "eth*", so it has no effect`,
		`4: egressInterfaces[2]: "ens5" is matched by egressInterfaces[5] "ens*", so it has no effect`,
		`5: egressInterfaces[3]: "ens5" duplicates egressInterfaces[2] "ens5", so it has no effect`,
		`6: egressInterfaces[4]: "eth1*" is matched by egressInterfaces[1] "eth*", so it has no effect`,
		`8: egressInterfaces[6]: "ens*" duplicates egressInterfaces[5] "ens*", so it has no effect`,
	)
}

func TestCheckManifest(t *testing.T) {
	manifest := `# the ConfigMap, as kept in Git
apiVersion: v1
kind: ConfigMap
metadata:
  name: ip-masq-agent
  namespace: kube-system
data:
  config: |
    nonMasqueradeCIDRs:
      - 10.0.0.0/8
      - 10.0.0.1/8
    masqLinkLocl: true
`
	wantProblems(t, problems(manifest, v4Only, false),
		`11: nonMasqueradeCIDRs[1]: "10.0.0.1/8" is not aligned to its prefix length (did you mean "10.0.0.0/8"?)`,
		`12: masqLinkLocl: unknown key ignored (did you mean "masqLinkLocal"?) (warning)`)

	// Several documents; a quoted value (lines are the key's); Azure's key names.
	multi := `apiVersion: v1
kind: Namespace
metadata: {name: x}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: azure-ip-masq-agent-config}
data:
  ip-masq-agent: "nonMasqueradeCIDRs: [10.0.0.1/8]\nmasqLinkLocal: true\n"
  ip-masq-agent-reconciled: |-
    masqLinkLocal: maybe
  other: ignored
`
	wantProblems(t, problems(multi, v4Only, false),
		`8: ConfigMap "azure-ip-masq-agent-config" has no data key "config", the only key the shipped DaemonSet mounts (deploy/daemonset.yaml): `+
			`with it the agent would run the defaults; keys named ip-masq... are read only where the whole ConfigMap is mounted as a directory (Azure ip-masq-agent-v2) (warning)`,
		`9: nonMasqueradeCIDRs[0]: "10.0.0.1/8" is not aligned to its prefix length (did you mean "10.0.0.0/8"?)`,
		`11: masqLinkLocal: expected true or false, got string "maybe"`)

	wantProblems(t, problems("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata:\n  foo: bar\n", v4Only, false),
		`4: ConfigMap "x" has no data key "config" (or named ip-masq...): not an ip-masq-agent config (warning)`)
	wantProblems(t, problems("apiVersion: apps/v1\nkind: DaemonSet\nspec: {}\n", v4Only, true))
	if k := Kinds([]byte("apiVersion: apps/v1\nkind: DaemonSet\n---\napiVersion: v1\nkind: ConfigMap\n")); strings.Join(k, ",") != "DaemonSet,ConfigMap" {
		t.Errorf("Kinds = %q", k)
	}
	if k := Kinds([]byte("masqLinkLocal: true\n")); k != nil {
		t.Errorf("Kinds of a config = %q", k)
	}
	wantProblems(t, problems("apiVersion: v1\nkind: ConfigMap\ndata:\n  config:\n    masqLinkLocal: true\n", v4Only, false),
		`5: data.config: expected the config file's text as a string`)

	// A JSON manifest (kubectl get -o json).
	wantProblems(t, problems(`{"apiVersion": "v1", "kind": "ConfigMap",
 "data": {"config": "{\"masqOutBound\": 1}"}}`, v4Only, false),
		`2: masqOutBound: expected true or false, got number 1`)

	// A valid manifest, and a config that merely mentions ConfigMap.
	wantProblems(t, problems("apiVersion: v1\nkind: ConfigMap\ndata:\n  config: |\n    masqLinkLocal: true\n", v4Only, true))
	wantProblems(t, problems("# not a ConfigMap\nmasqLinkLocal: true\n", v4Only, true))
}

func TestFromManifest(t *testing.T) {
	got, ok, err := FromManifest([]byte("apiVersion: v1\nkind: ConfigMap\ndata:\n  config: |\n    masqLinkLocal: true\n"))
	if !ok || err != nil || string(got) != "masqLinkLocal: true\n" {
		t.Errorf("FromManifest = %q, %v, %v", got, ok, err)
	}
	if _, ok, _ := FromManifest([]byte("masqLinkLocal: true # ConfigMap\n")); ok {
		t.Error("a config is not a manifest")
	}
	_, ok, err = FromManifest([]byte("apiVersion: v1\nkind: ConfigMap\ndata:\n  ip-masq-a: x\n  ip-masq-b: y\n"))
	if !ok || err == nil || !strings.Contains(err.Error(), "2 configs") {
		t.Errorf("two configs: %v, %v", ok, err)
	}
	_, ok, err = FromManifest([]byte("apiVersion: v1\nkind: ConfigMap\ndata: {}\n"))
	if !ok || err == nil || !strings.Contains(err.Error(), "line 3") {
		t.Errorf("no config: %v, %v", ok, err)
	}
}

// Check agrees with Parse on whether a file is accepted, for every input
// of the fuzz corpus and the examples above.
func FuzzCheck(f *testing.F) {
	for _, s := range []string{"", "nonMasqueradeCIDRs: [10.0.0.0/8, x]\n", `{"a": [1, {"b": [2]}], "cidrLimit": 0}`,
		"apiVersion: v1\nkind: ConfigMap\ndata:\n  config: |\n    a: 1\n", "- 1\n", "{\"a\": tr"} {
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, data []byte, strict bool) {
		ps := Check(data, v6, strict)
		errs := 0
		for _, p := range ps {
			if p.Line < 1 || strings.ContainsAny(p.Message, "\r\n") {
				t.Fatalf("bad problem %+v", p)
			}
			if !p.Warning {
				errs++
			}
		}
		if _, ok := manifestConfigs(data); ok || strict {
			return
		}
		_, _, err := Parse(data, v6)
		if (err != nil) != (errs > 0) {
			t.Fatalf("Parse error %v, Check %d errors: %s", err, errs, fmt.Sprint(ps))
		}
	})
}

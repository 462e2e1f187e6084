package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestValidateNothingChecked: validate fails when no FILE held a config
// (a CI job that globs the wrong files must not pass), with --strict or
// without.
func TestValidateNothingChecked(t *testing.T) {
	ds := writeFile(t, "ds.yaml", "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: x\n")
	for _, args := range [][]string{{"validate", ds}, {"validate", "--strict", ds}} {
		code, _, errOut := runCmd(t, args...)
		if code != 1 || !strings.Contains(errOut, "0 files checked") || !strings.Contains(errOut, "nothing checked") {
			t.Errorf("%v: exit %d %q, want 1 and nothing checked", args, code, errOut)
		}
	}
}

// TestValidateList: a kind: List (kubectl get -o yaml) is looked into: its
// ConfigMap is checked, lines pointing into the file.
func TestValidateList(t *testing.T) {
	list := writeFile(t, "list.yaml", `apiVersion: v1
kind: List
items:
  - apiVersion: apps/v1
    kind: DaemonSet
    metadata:
      name: ip-masq-agent
  - apiVersion: v1
    kind: ConfigMap
    metadata:
      name: ip-masq-agent
    data:
      config: |
        nonMasqueradeCIDRs:
          - 10.0.0.0/88
`)
	code, out, errOut := runCmd(t, "validate", "--strict", list)
	if code != 1 || !strings.HasPrefix(out, list+`:15: nonMasqueradeCIDRs[0]: "10.0.0.0/88" is not a valid CIDR`) || !strings.Contains(errOut, "1 file checked: 1 error") {
		t.Errorf("a List holding a bad ConfigMap: exit %d %q %q", code, out, errOut)
	}
	good := writeFile(t, "good.yaml", "apiVersion: v1\nkind: ConfigMapList\nitems:\n- apiVersion: v1\n  kind: ConfigMap\n  data:\n    config: |\n      nonMasqueradeCIDRs: [10.0.0.0/8]\n")
	if code, out, errOut := runCmd(t, "validate", "--strict", good); code != 0 || out != "" || errOut != "1 file checked: 0 errors, 0 warnings\n" {
		t.Errorf("a ConfigMapList holding a good ConfigMap: exit %d %q %q", code, out, errOut)
	}
}

// TestValidateDirectoryWithoutConfig: a directory without files named
// ip-masq* is a warning, an error under --strict, and nothing is checked.
func TestValidateDirectoryWithoutConfig(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "other"), []byte("nonMasqueradeCIDRs: [10.0.0.0/8]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, _ := runCmd(t, "validate", dir)
	if code != 1 || out != dir+": a directory without files named ip-masq*: the agent would use the defaults (warning)\n" {
		t.Errorf("validate DIR: exit %d %q", code, out)
	}
	code, out, errOut := runCmd(t, "validate", "--strict", dir)
	if code != 1 || out != dir+": a directory without files named ip-masq*: the agent would use the defaults\n" || !strings.Contains(errOut, "0 files checked: 1 error") {
		t.Errorf("validate --strict DIR: exit %d %q %q", code, out, errOut)
	}
}

// TestValidateConfigMapWithoutMountedKey: the shipped DaemonSet mounts
// only the data key "config"; a ConfigMap whose only config key is
// ip-masq-agent (Azure's layout) would leave the agent on the defaults:
// a warning, an error under --strict. With the key config, no warning.
func TestValidateConfigMapWithoutMountedKey(t *testing.T) {
	azure := writeFile(t, "cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ip-masq-agent\ndata:\n  ip-masq-agent: |\n    nonMasqueradeCIDRs: [10.0.0.0/8]\n")
	code, out, _ := runCmd(t, "validate", azure)
	want := azure + `:5: ConfigMap "ip-masq-agent" has no data key "config", the only key the shipped DaemonSet mounts`
	if code != 0 || !strings.HasPrefix(out, want) || !strings.HasSuffix(out, "(warning)\n") {
		t.Errorf("validate: exit %d %q", code, out)
	}
	if code, out, _ = runCmd(t, "validate", "--strict", azure); code != 1 || !strings.HasPrefix(out, want) || strings.Contains(out, "(warning)") {
		t.Errorf("validate --strict: exit %d %q", code, out)
	}
	both := writeFile(t, "both.yaml", "apiVersion: v1\nkind: ConfigMap\ndata:\n  config: |\n    nonMasqueradeCIDRs: [10.0.0.0/8]\n")
	if code, out, _ = runCmd(t, "validate", "--strict", both); code != 0 || out != "" {
		t.Errorf("a ConfigMap with the key config: exit %d %q", code, out)
	}
}

// TestValidateExample: the example validate --help prints works as
// printed, run from the repository's root: it checks a file and passes.
func TestValidateExample(t *testing.T) {
	args := strings.Fields(validateCommand.example)
	if len(args) < 3 || args[0] != "ip-masq-agent" || args[1] != "validate" {
		t.Fatalf("the example %q", validateCommand.example)
	}
	var expanded []string
	for _, a := range args[2:] {
		if strings.HasPrefix(a, "-") {
			expanded = append(expanded, a)
			continue
		}
		m, err := filepath.Glob(filepath.Join("..", "..", a)) // as the shell expands it at the root
		if err != nil || len(m) == 0 {
			t.Fatalf("the example's %s matches nothing in the repository", a)
		}
		expanded = append(expanded, m...)
	}
	code, out, errOut := runCmd(t, append([]string{"validate"}, expanded...)...)
	if code != 0 || out != "" || !strings.Contains(errOut, "1 file checked: 0 errors, 0 warnings") {
		t.Errorf("%s: exit %d %q %q", validateCommand.example, code, out, errOut)
	}
}

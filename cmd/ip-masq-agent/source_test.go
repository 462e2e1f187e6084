package main

import (
	"strings"
	"testing"
)

// nonMasqueradeSourceCIDRs end to end without a kernel: validate names a
// bad value by file, key, index and value; render shows its set and rule;
// explain --from decides by the source, and without it says it cannot.
func TestNonMasqueradeSourceCIDRs(t *testing.T) {
	bad := writeFile(t, "ip-masq-agent", "nonMasqueradeSourceCIDRs: [10.244.1.0/24, 10.244.2.1/24]\n")
	if code, out, _ := runCmd(t, "validate", bad); code != 1 ||
		!strings.Contains(out, bad+":1: nonMasqueradeSourceCIDRs[1]: \"10.244.2.1/24\" is not aligned") {
		t.Errorf("validate: %d %q", code, out)
	}
	path := writeFile(t, "ip-masq-agent", "nonMasqueradeSourceCIDRs: [10.244.1.0/24]\n")
	code, out, errOut := runCmd(t, "render", "--config", path)
	if code != 0 || !strings.Contains(out, "ip saddr @nonmasq-src-v4 counter return") || !strings.Contains(out, "elements = { 10.244.1.0/24 }") {
		t.Errorf("render: %d %q\n%s", code, errOut, out)
	}
	code, out, _ = runCmd(t, "explain", "--config", path, "--from", "10.244.1.5", "203.0.113.1")
	if want := "203.0.113.1  not masqueraded  nonMasqueradeSourceCIDRs[0] 10.244.1.0/24\n"; code != 0 || out != want {
		t.Errorf("explain --from inside: %d %q, want %q", code, out, want)
	}
	code, out, _ = runCmd(t, "explain", "--config", path, "--from", "10.244.3.5", "203.0.113.1")
	if want := "203.0.113.1  masquerade       masqOutBound: true (no other rule matched)\n"; code != 0 || out != want {
		t.Errorf("explain --from outside: %d %q, want %q", code, out, want)
	}
	code, out, _ = runCmd(t, "explain", "--config", path, "203.0.113.1")
	if code != 0 || !strings.Contains(out, "undetermined") || !strings.Contains(out, "depends on the source (nonMasqueradeSourceCIDRs)") {
		t.Errorf("explain without --from: %d %q", code, out)
	}
	if code, _, errOut := runCmd(t, "explain", "--config", path, "--from", "pod", "203.0.113.1"); code != 2 || !strings.Contains(errOut, `--from "pod" is not an IP address`) {
		t.Errorf("explain --from pod: %d %q", code, errOut)
	}
}

package agent

import (
	"strings"
	"testing"
	"time"
)

// TestOctalPrefixLength: a prefix length with a leading zero means what
// the original's iptables-restore installed (octal: /010 is /8), with one
// warning per change of the file naming file, key, value and reading; a
// length that is no octal number (/08), which the original's
// iptables-restore refused, is a refused config: at a first start no
// table, later the table stays as it was.
func TestOctalPrefixLength(t *testing.T) {
	h := newHarness(t, nil)
	h.write("nonMasqueradeCIDRs: [10.0.0.0/08]\n")
	if err := h.a.Sync(t0); err == nil || !strings.Contains(err.Error(), h.path+`: nonMasqueradeCIDRs[0]: "10.0.0.0/08" has a leading zero in its prefix length, which iptables reads as an octal number`) {
		t.Fatalf("/08 at first start: %v", err)
	}
	if h.fake.Table() != nil || h.ready() {
		t.Fatalf("a table, or ready, after a refused first config")
	}

	const octal = "nonMasqueradeCIDRs: [10.0.0.0/010]\nresyncInterval: 5s\n"
	h.write(octal)
	h.sync(at(time.Second))
	h.sync(at(10 * time.Second)) // a resync: the same warning is not logged again
	h.holds(h.want("nonMasqueradeCIDRs: [10.0.0.0/8]\nresyncInterval: 5s\n"), "/010")
	warn := h.path + `: nonMasqueradeCIDRs[0]: \"10.0.0.0/010\" has a leading zero in its prefix length, which the original agent's iptables-restore read as octal: \"10.0.0.0/8\", not \"10.0.0.0/10\"`
	if n := strings.Count(h.logs.String(), warn); n != 1 {
		t.Errorf("the warning logged %d times, want 1:\n%s", n, h.logs.String())
	}

	h.write("nonMasqueradeCIDRs: [10.0.0.0/08]\nresyncInterval: 5s\n")
	if err := h.a.Sync(at(20 * time.Second)); err == nil {
		t.Fatal("/08 applied")
	}
	h.holds(h.want("nonMasqueradeCIDRs: [10.0.0.0/8]\nresyncInterval: 5s\n"), "/08 after /010")
}

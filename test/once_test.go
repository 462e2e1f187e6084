package test

import (
	"strings"
	"testing"
)

// TestOnceOwnedByOther: --once while a running agent owns the table exits
// 1 at once with one line that says it does not wait (it used to log
// "waiting for it to exit" and fail milliseconds later); the running
// agent's table is untouched. Where the kernel cannot own the table, --once
// applies its config (the fallback: verify and repair).
func TestOnceOwnedByOther(t *testing.T) {
	topo := newTopology(t)
	cfg := writeConfig(t, "nonMasqueradeCIDRs: [10.0.0.0/8]\n")
	d := startDaemon(t, topo, "--config", cfg, "--http-address=127.0.0.1:0")
	eventually(t, "the table", func() bool { return strings.Contains(d.output(), "applied config") })
	before := withoutCounters(listTable(t, topo))
	out, err := runAgent(t, topo, "--once", "--config", cfg)
	if !ownsTable(t, topo, d) {
		if err != nil {
			t.Errorf("--once next to an agent that cannot own the table: %v\n%s", err, out)
		}
		return
	}
	if err == nil || !strings.Contains(out, "--once does not wait for the owner") || strings.Contains(out, "waiting for it to exit") {
		t.Errorf("--once while another agent owns the table: %v\n%s", err, out)
	}
	if after := withoutCounters(listTable(t, topo)); after != before {
		t.Errorf("the owner's table changed:\n%s\nwant:\n%s", after, before)
	}
}

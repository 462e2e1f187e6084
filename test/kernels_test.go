package test

import (
	"strings"
	"testing"

	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft/kernel"
)

// kernelOwns reports whether the kernel can own the agent's table, learnt
// as the agent learns it (kernel.Netlink.Probe asks the kernel). A test of
// ownership asserts, on a kernel that cannot own (before 6.9), the
// fallback: the table verified and repaired.
func kernelOwns(t *testing.T, topo *testnet.Topology) bool {
	t.Helper()
	k := &kernel.Netlink{NetNS: int(topo.NodeHandle())}
	defer k.Close()
	if err := k.Probe(); err != nil {
		t.Fatalf("probe: %v", err)
	}
	if !k.Owns() {
		t.Logf("this kernel cannot own the table: the fallback is asserted")
	}
	return k.Owns()
}

// cannotOwnLog is the line the agent logs when the kernel refused the owned
// table (nft/ownership.go): it then verifies and repairs.
const cannotOwnLog = "the kernel cannot own a persistent table"

// ownsTable says whether agent d owns its table: false where the kernel
// refused the owned table (the agent logged cannotOwnLog), for a test to
// assert the fallback, verify and repair, instead of skipping. A table
// that is not owned without that line fails the test.
func ownsTable(t *testing.T, topo *testnet.Topology, d *daemon) bool {
	t.Helper()
	if strings.Contains(d.output(), cannotOwnLog) {
		t.Logf("this kernel cannot own the table: the fallback is asserted")
		return false
	}
	if !strings.Contains(listTable(t, topo), "flags owner") {
		t.Fatalf("the agent did not log %q, yet its table is not owned:\n%s", cannotOwnLog, listTable(t, topo))
	}
	return true
}

// TestKernelSmoke is make test-kernels' packet-level smoke test of the
// agent binary, the same on every kernel (docs/kernels.md): the daemon with
// its default flags applies its table, each destination sees the source the
// config decides, a foreign change is repaired (or, on a kernel that owns
// the table, refused by the kernel), a config change is applied, and the
// conntrack cleanup moves a running UDP flow to the new decision. Which
// mode the kernel gets is learnt from what it did, never from its version,
// and asserted either way: an owned table refuses the foreign change; a
// table the kernel could not own was logged as such and is repaired. The
// mode is logged as "kernel mode: owned" or "kernel mode:
// verify-and-repair" for make test-kernels' summary.
func TestKernelSmoke(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, internet1, private1, internet6a)
	if err := topo.EnableConntrack(); err != nil {
		t.Fatal(err)
	}
	cm := newConfigMapDir(t, "resyncInterval: 1h\n")
	d := startDaemon(t, topo, "--config", cm.path(), "--http-address=127.0.0.1:0", "--enable-ipv6")

	// Apply, and the decision per destination.
	eventually(t, "the first config", func() bool { return strings.Contains(d.output(), `msg="applied config"`) })
	expectSources(t, topo, map[string]bool{internet1: true, private1: false, nodeLocal: false, internet6a: true})
	want := withoutCounters(listTable(t, topo))

	// The mode, from the kernel's own answers.
	owned := strings.Contains(listTable(t, topo), "flags owner")
	fellBack := strings.Contains(d.output(), cannotOwnLog)
	switch {
	case owned && fellBack:
		t.Fatalf("the table is owned, yet the agent logged %q:\n%s", cannotOwnLog, d.output())
	case owned:
		t.Logf("kernel mode: owned")
	case fellBack:
		t.Logf("kernel mode: verify-and-repair")
		for _, l := range strings.Split(d.output(), "\n") {
			if strings.Contains(l, cannotOwnLog) {
				t.Logf("the agent: %s", l) // the kernel's refusal, as it answered
			}
		}
	default:
		t.Fatalf("the table is not owned, and the agent did not say why (%q):\n%s", cannotOwnLog, listTable(t, topo))
	}

	// A foreign change: refused by an owning kernel, repaired otherwise.
	tamper := []string{"add", "element", "inet", "ip-masq-agent", "nonmasq-v4", "{ 203.0.113.0/24 }"}
	out, err := topo.NFT(tamper...)
	switch {
	case owned && err == nil:
		t.Errorf("the kernel let nft change the owned table")
	case owned && !strings.Contains(out, "Operation not permitted"):
		t.Errorf("nft %s: %v %s; want Operation not permitted", strings.Join(tamper, " "), err, out)
	case !owned && err != nil:
		t.Fatalf("nft %s: %v %s", strings.Join(tamper, " "), err, out)
	case !owned:
		eventually(t, "the repair logged", func() bool { return strings.Contains(d.output(), "put it back") })
	}
	if got := withoutCounters(listTable(t, topo)); got != want {
		t.Errorf("after the foreign change the table is:\n%s\nwant:\n%s", got, want)
	}
	expectSources(t, topo, map[string]bool{internet1: true})

	// A config change, and the conntrack cleanup: a UDP flow that started
	// masqueraded gets the new decision (not masqueraded) without a new
	// socket.
	s := startUDPStream(t, topo, internet1)
	s.waitFor(t, topo.NodeUplink4)
	applied := strings.Count(d.output(), "applied new config")
	cm.update("resyncInterval: 1h\nnonMasqueradeCIDRs: [203.0.113.0/24]\n")
	eventually(t, "the config change", func() bool { return strings.Count(d.output(), "applied new config") > applied })
	expectSources(t, topo, map[string]bool{internet1: false, private1: true, internet6a: true})
	s.waitFor(t, topo.Pod4)
	eventually(t, "the conntrack cleanup logged", func() bool { return strings.Contains(d.output(), "conntrack cleanup: examined") })
}

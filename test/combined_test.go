package test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
)

// allKeys sets every key of the masquerade policy at once: the three
// levels of cidrMatch: mostSpecific, the pods-only guard with one pod
// excepted, the uplink's interfaces and a snat address per family.
const allKeys = "cidrMatch: mostSpecific\n" +
	"nonMasqueradeCIDRs: [10.0.0.0/8, 10.20.30.0/24]\n" +
	"masqueradeCIDRs: [10.20.0.0/16]\n" +
	"masqueradeSourceCIDRs: [10.244.1.0/24, \"fd00:1::/64\"]\n" +
	"nonMasqueradeSourceCIDRs: [10.244.1.3/32, \"fd00:1::3/128\"]\n" +
	"snatAddress: 192.0.2.10\n" +
	"snatAddressIPv6: \"2001:db8:1::10\"\n"

// TestPacketsAllKeys proves the keys of the masquerade policy together,
// with packets: each decides as it does alone, and the rest still apply.
// The first pod's traffic is source-NATed to the snat address where the
// most specific CIDR says masquerade (10.20/16, the internet) and leaves
// with its own address where it says not (10/8, 10.20.30/24); the second
// pod (nonMasqueradeSourceCIDRs) is never masqueraded; with
// egressInterfaces naming no interface the traffic leaves by, nothing is;
// explain --from names the key that decided.
func TestPacketsAllKeys(t *testing.T) {
	topo := newTopology(t)
	const (
		in8  = "10.250.0.10" // 10/8 only: not
		in16 = "10.20.1.10"  // 10.20/16: masquerade
		in24 = "10.20.30.10" // 10.20.30/24: not
	)
	addDestinations(t, topo, in8, in16, in24, internet1, internet6a)
	pod2, pod26 := netip.MustParseAddr("10.244.1.3"), netip.MustParseAddr("fd00:1::3")
	for _, p := range []string{"10.244.1.3/24", "fd00:1::3/64"} {
		if err := topo.AddPodAddress(netip.MustParsePrefix(p)); err != nil {
			t.Fatalf("add pod address %s: %v", p, err)
		}
	}
	for _, p := range []netip.Prefix{snat4, snat6} {
		if err := topo.AddNodeAddress(testnet.NodeUplinkIf, p); err != nil {
			t.Fatal(err)
		}
	}
	// expect: the source each destination sees from src, the snat address
	// where masqueraded.
	expect := func(what string, src netip.Addr, masqueraded map[string]bool) {
		t.Helper()
		for dst, masq := range masqueraded {
			d := netip.MustParseAddr(dst)
			want := src
			if masq {
				want = snat4.Addr()
				if d.Is6() {
					want = snat6.Addr()
				}
			}
			got, err := topo.SourceSeenFrom(src, d)
			if err != nil {
				t.Errorf("%s: connect from %s to %s: %v", what, src, dst, err)
			} else if got != want {
				t.Errorf("%s: %s from %s saw source %s, want %s (masqueraded: %v)", what, dst, src, got, want, masq)
			}
		}
	}

	cfg := allKeys + "egressInterfaces: [\"eth*\"]\n"
	mustApply(t, topo, cfg, "--enable-ipv6")
	expect("every key", topo.Pod4, map[string]bool{internet1: true, in16: true, in24: false, in8: false})
	expect("every key", topo.Pod6, map[string]bool{internet6a: true})
	expect("every key, the excepted pod", pod2, map[string]bool{internet1: false, in16: false})
	expect("every key, the excepted pod", pod26, map[string]bool{internet6a: false})

	for _, c := range []struct{ from, to, want string }{
		{topo.Pod4.String(), in16, "masqueradeCIDRs[0] 10.20.0.0/16"},
		{topo.Pod4.String(), in24, "nonMasqueradeCIDRs[1] 10.20.30.0/24"},
		{pod2.String(), internet1, "nonMasqueradeSourceCIDRs"},
		{"10.99.0.1", internet1, "masqueradeSourceCIDRs"},
	} {
		code, out, stderr := runTool(t, topo, "explain", "--config", writeConfig(t, cfg), "--enable-ipv6", "--via", testnet.NodeUplinkIf, "--from", c.from, c.to)
		if code != 0 || !strings.Contains(out, c.want) {
			t.Errorf("explain --from %s %s: exit %d, want %q in\n%s%s", c.from, c.to, code, c.want, out, stderr)
		}
	}

	// The uplink is not among egressInterfaces: nothing leaves masqueraded.
	mustApply(t, topo, allKeys+"egressInterfaces: [\"ens*\"]\n", "--enable-ipv6")
	expect("egressInterfaces without the uplink", topo.Pod4, map[string]bool{internet1: false, in16: false})
	expect("egressInterfaces without the uplink", topo.Pod6, map[string]bool{internet6a: false})
	if t.Failed() {
		t.Logf("table:\n%s", listTable(t, topo))
	}
}

// TestConntrackDaemonCIDRMatch: a change of cidrMatch alone moves an
// established UDP flow. Under listOrder, masqueradeCIDRs (10.20/16) comes
// first and the stream to 10.20.30.10 is masqueraded; under mostSpecific
// nonMasqueradeCIDRs' 10.20.30/24 decides: the daemon deletes the entry,
// and the stream's next datagrams leave with the pod's address.
func TestConntrackDaemonCIDRMatch(t *testing.T) {
	topo := newTopology(t)
	const in24 = "10.20.30.10"
	addDestinations(t, topo, in24)
	if err := topo.EnableConntrack(); err != nil {
		t.Fatal(err)
	}
	lists := "resyncInterval: 1h\nnonMasqueradeCIDRs: [10.0.0.0/8, 10.20.30.0/24]\nmasqueradeCIDRs: [10.20.0.0/16]\n"
	cm := newConfigMapDir(t, lists)
	d := startDaemon(t, topo, "--config", cm.path(), "--http-address=127.0.0.1:0")
	eventually(t, "the rules", sourcesAre(topo, map[string]bool{in24: true}))
	s := startUDPStream(t, topo, in24)
	s.waitFor(t, topo.NodeUplink4)
	cm.update("cidrMatch: mostSpecific\n" + lists)
	eventually(t, "the new config", func() bool { return strings.Contains(d.output(), "applied new config") })
	s.waitFor(t, topo.Pod4)
	eventually(t, "the cleanup logged with its count", func() bool {
		return strings.Contains(d.output(), "conntrack cleanup: examined") && strings.Contains(d.output(), "deleted 1 ")
	})
}

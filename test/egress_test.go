package test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft/kernel"
)

// egressTopology is a topology with two uplinks: eth0 (the default route)
// and ens5 (testnet.Uplink2Dst4 and Uplink2Dst6), a second pod address,
// and destinations behind each.
func egressTopology(t *testing.T) (*testnet.Topology, netip.Addr, netip.Addr) {
	t.Helper()
	topo := newTopology(t)
	addDestinations(t, topo, internet1, private1, internet6a)
	if err := topo.AddUplink2(); err != nil {
		t.Fatalf("second uplink: %v", err)
	}
	for _, p := range []string{"10.244.1.3/24", "fd00:1::3/64"} {
		if err := topo.AddPodAddress(netip.MustParsePrefix(p)); err != nil {
			t.Fatalf("add pod address %s: %v", p, err)
		}
	}
	return topo, netip.MustParseAddr("10.244.1.3"), netip.MustParseAddr("fd00:1::3")
}

// TestPacketsEgressInterfaces proves egressInterfaces with packets over
// two uplinks, eth0 and ens5, in both families: only traffic leaving
// through a listed interface is masqueraded (to that interface's
// address), a name with nft's "*" included; the interface guard comes
// before masqueradeCIDRs; combined with masqueradeSourceCIDRs and
// nonMasqueradeSourceCIDRs every guard must pass; without the key the
// table has no interface set and both uplinks masquerade again.
func TestPacketsEgressInterfaces(t *testing.T) {
	topo, pod2, pod26 := egressTopology(t)
	up2v4, up2v6 := testnet.Uplink2Dst4.String(), testnet.Uplink2Dst6.String()
	// masqAs: the source each destination must see from src; "" for src itself.
	expect := func(src netip.Addr, want map[string]netip.Addr) {
		t.Helper()
		for dst, as := range want {
			if !as.IsValid() {
				as = src
			}
			got, err := topo.SourceSeenFrom(src, netip.MustParseAddr(dst))
			if err != nil {
				t.Errorf("connect from %s to %s: %v", src, dst, err)
				continue
			}
			if got != as {
				t.Errorf("%s from %s saw source %s, want %s", dst, src, got, as)
			}
		}
	}
	none := netip.Addr{}
	eth0v4, eth0v6 := topo.NodeUplink4, topo.NodeUplink6
	ens5v4, ens5v6 := testnet.NodeUplink2v4, testnet.NodeUplink2v6
	tableHas := func(wants ...string) {
		t.Helper()
		table := listTable(t, topo)
		for _, want := range wants {
			if !strings.Contains(table, want) {
				t.Errorf("nft list lacks %q:\n%s", want, table)
			}
		}
	}

	mustApply(t, topo, "egressInterfaces: [eth0]\n", "--enable-ipv6")
	tableHas(`oifname != @egress-if-v4 counter packets`, `oifname != @egress-if-v6 counter packets`, `elements = { "eth0" }`)
	expect(topo.Pod4, map[string]netip.Addr{internet1: eth0v4, up2v4: none})
	expect(topo.Pod6, map[string]netip.Addr{internet6a: eth0v6, up2v6: none})

	mustApply(t, topo, "egressInterfaces: [\"ens*\"]\nmasqueradeCIDRs: [10.250.0.10/32]\n", "--enable-ipv6")
	tableHas(`elements = { "ens*" }`)
	expect(topo.Pod4, map[string]netip.Addr{internet1: none, private1: none, up2v4: ens5v4})
	expect(topo.Pod6, map[string]netip.Addr{internet6a: none, up2v6: ens5v6})

	// Every guard: the interface, the source list, the source exceptions.
	mustApply(t, topo, "egressInterfaces: [\"eth*\", \"ens*\"]\nmasqueradeSourceCIDRs: [10.244.1.0/24, \"fd00:1::/64\"]\n"+
		"nonMasqueradeSourceCIDRs: [10.244.1.3/32]\nnonMasqueradeCIDRs: [10.0.0.0/8]\n", "--enable-ipv6")
	expect(topo.Pod4, map[string]netip.Addr{internet1: eth0v4, private1: none, up2v4: ens5v4})
	expect(topo.Pod6, map[string]netip.Addr{internet6a: eth0v6, up2v6: ens5v6})
	expect(pod2, map[string]netip.Addr{internet1: none, up2v4: none})
	expect(pod26, map[string]netip.Addr{internet6a: eth0v6, up2v6: ens5v6})
	mustApply(t, topo, "egressInterfaces: [\"ens*\"]\nmasqueradeSourceCIDRs: [10.244.1.2/32]\n", "--enable-ipv6")
	expect(topo.Pod4, map[string]netip.Addr{internet1: none, up2v4: ens5v4})
	expect(pod2, map[string]netip.Addr{up2v4: none})
	expect(topo.Pod6, map[string]netip.Addr{up2v6: none}) // the literal source guard: no IPv6 entry

	mustApply(t, topo, "nonMasqueradeCIDRs: [10.0.0.0/8]\n", "--enable-ipv6")
	if table := listTable(t, topo); strings.Contains(table, "egress-if") {
		t.Errorf("without egressInterfaces the table still has its sets:\n%s", table)
	}
	expect(topo.Pod4, map[string]netip.Addr{internet1: eth0v4, up2v4: ens5v4})
	expect(topo.Pod6, map[string]netip.Addr{internet6a: eth0v6, up2v6: ens5v6})
	if t.Failed() {
		t.Logf("table:\n%s", listTable(t, topo))
	}
}

// TestEgressInterfacesReadBack: the kernel's ifname interval set reads
// back as the wanted one (an unchanged resync sends nothing), nft lists
// the names as written, wildcards included, and a change of the list
// sends only the element differences.
func TestEgressInterfacesReadBack(t *testing.T) {
	topo := newTopology(t)
	a := &kernel.Netlink{NetNS: int(topo.NodeHandle()), NoOwner: true}
	rs := build(t, "egressInterfaces: [eth0, \"ens*\", \"veth1*\", \"abcdefghijklmno\"]\n")
	mustApplyRS(t, a, rs)
	if res := mustApplyRS(t, a, rs); !res.Unchanged || res.Messages != 0 {
		t.Errorf("unchanged resync: %+v, want nothing sent", res)
	}
	// nft wraps a set's elements a line each: compared without white space.
	flat := func() string { return strings.Join(strings.Fields(listTable(t, topo)), " ") }
	if table := flat(); !strings.Contains(table, `elements = { "abcdefghijklmno", "ens*", "eth0", "veth1*" }`) {
		t.Errorf("nft list:\n%s", table)
	}
	res := mustApplyRS(t, a, build(t, "egressInterfaces: [eth0, \"wg*\"]\n"))
	if res.Unchanged || res.Created {
		t.Errorf("changed list: %+v, want the elements changed in place", res)
	}
	if table := flat(); !strings.Contains(table, `elements = { "eth0", "wg*" }`) {
		t.Errorf("nft list after the change:\n%s", table)
	}
	found, _, err := a.Read()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{nft.SetEgressIfV4, nft.SetEgressIfV6} {
		if s := found.Set(name); s == nil || s.Key != nft.KeyIfname || s.Odd != "" {
			t.Errorf("set %s read back as %+v", name, s)
		}
	}
}

// TestConntrackDaemonEgressInterfaces: the daemon's conntrack cleanup
// finds a flow's out interface by the node's route. Two UDP streams from
// the pod in each family, one leaving through eth0, one through ens5, all
// masqueraded; then egressInterfaces drops ens5: those streams' entries
// are deleted (their next datagram leaves unmasqueraded), eth0's are kept
// (same address and port throughout).
func TestConntrackDaemonEgressInterfaces(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, internet1, internet6a)
	if err := topo.AddUplink2(); err != nil {
		t.Fatal(err)
	}
	if err := topo.EnableConntrack(); err != nil {
		t.Fatal(err)
	}
	cm := newConfigMapDir(t, "resyncInterval: 1h\negressInterfaces: [eth0, \"ens*\"]\n")
	d := startDaemon(t, topo, "--config", cm.path(), "--http-address=127.0.0.1:0", "--enable-ipv6")
	eventually(t, "the rules", sourcesAre(topo, map[string]bool{internet1: true}))
	first := startUDPStream(t, topo, internet1)
	second := startUDPStream(t, topo, testnet.Uplink2Dst4.String())
	first6 := startUDPStream(t, topo, internet6a)
	second6 := startUDPStream(t, topo, testnet.Uplink2Dst6.String())
	before := first.waitFor(t, topo.NodeUplink4)
	before6 := first6.waitFor(t, topo.NodeUplink6)
	second.waitFor(t, testnet.NodeUplink2v4)
	second6.waitFor(t, testnet.NodeUplink2v6)
	cm.update("resyncInterval: 1h\negressInterfaces: [eth0]\n")
	eventually(t, "the new config", func() bool { return strings.Contains(d.output(), "applied new config") })
	second.waitFor(t, topo.Pod4)
	second6.waitFor(t, topo.Pod6)
	first.expectOnly(t, before, 20)
	first6.expectOnly(t, before6, 20)
	eventually(t, "the cleanup logged with its count", func() bool {
		return strings.Contains(d.output(), "conntrack cleanup: examined") && strings.Contains(d.output(), "deleted 2 ")
	})
}

// TestExplainLiveEgressInterfaces: explain --live, without --via, asks the
// node's routing table which interface a destination leaves through, and
// agrees with the kernel's table for destinations behind each uplink;
// --via overrides the route.
func TestExplainLiveEgressInterfaces(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, internet1)
	if err := topo.AddUplink2(); err != nil {
		t.Fatal(err)
	}
	const cfg = "egressInterfaces: [\"ens*\"]\n"
	mustApply(t, topo, cfg)
	path := writeConfig(t, cfg)
	up2 := testnet.Uplink2Dst4.String()
	code, out, stderr := runTool(t, topo, "explain", "--live", "--config", path, internet1, up2)
	if code != 0 {
		t.Fatalf("explain --live: exit %d\n%s%s", code, out, stderr)
	}
	for _, want := range []string{
		internet1 + "\n  config: not masqueraded: egressInterfaces: eth0 is in none of its 1 entries\n  kernel: not masqueraded",
		"  route:  leaves through eth0 (the node's route now)",
		up2 + "\n  config: masquerade: masqOutBound: true (no other rule matched)\n  kernel: masquerade",
		"  route:  leaves through ens5 (the node's route now)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("explain --live lacks %q:\n%s", want, out)
		}
	}
	code, out, stderr = runTool(t, topo, "explain", "--live", "--config", path, "--via", "ens5", internet1)
	if code != 0 || !strings.Contains(out, "config: masquerade") || strings.Contains(out, "route:") {
		t.Errorf("explain --live --via ens5: exit %d\n%s%s", code, out, stderr)
	}
}

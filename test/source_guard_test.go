package test

import (
	"net/netip"
	"strings"
	"testing"
)

// TestPacketsSourceGuard proves masqueradeSourceCIDRs with packets: only
// traffic from the listed sources is masqueraded (the first pod's), a
// second pod address outside the list never is, in both families and
// whatever the destination (masqueradeCIDRs included); combined with
// nonMasqueradeSourceCIDRs, a source in both lists is not masqueraded; a
// list without IPv6 entries leaves all IPv6 traffic unmasqueraded (the
// literal guard); without the key the table has no guard and the second
// pod is masqueraded again.
func TestPacketsSourceGuard(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, internet1, private1, private2, internet6a)
	pod2, pod26 := netip.MustParseAddr("10.244.1.3"), netip.MustParseAddr("fd00:1::3")
	for _, p := range []string{"10.244.1.3/24", "fd00:1::3/64"} {
		if err := topo.AddPodAddress(netip.MustParsePrefix(p)); err != nil {
			t.Fatalf("add pod address %s: %v", p, err)
		}
	}
	expect := func(src netip.Addr, masqueraded map[string]bool) {
		t.Helper()
		for dst, masq := range masqueraded {
			d := netip.MustParseAddr(dst)
			want := src
			if masq {
				want = topo.NodeUplink4
				if d.Is6() {
					want = topo.NodeUplink6
				}
			}
			got, err := topo.SourceSeenFrom(src, d)
			if err != nil {
				t.Errorf("connect from %s to %s: %v", src, dst, err)
				continue
			}
			if got != want {
				t.Errorf("%s from %s saw source %s, want %s (masqueraded: %v)", dst, src, got, want, masq)
			}
		}
	}
	tableHas := func(wants ...string) {
		t.Helper()
		table := listTable(t, topo)
		for _, want := range wants {
			if !strings.Contains(table, want) {
				t.Errorf("nft list lacks %q:\n%s", want, table)
			}
		}
	}

	// Alone: the first pod's addresses only.
	mustApply(t, topo, "masqueradeSourceCIDRs: [10.244.1.2/32, \"fd00:1::2/128\"]\nmasqueradeCIDRs: [10.250.0.10/32]\n", "--enable-ipv6")
	tableHas("ip saddr != @masq-src-v4 counter packets", "ip6 saddr != @masq-src-v6 counter packets",
		"elements = { 10.244.1.2 }", "elements = { fd00:1::2 }")
	expect(topo.Pod4, map[string]bool{internet1: true, private1: true, private2: false})
	expect(topo.Pod6, map[string]bool{internet6a: true})
	expect(pod2, map[string]bool{internet1: false, private1: false, private2: false})
	expect(pod26, map[string]bool{internet6a: false})

	// With nonMasqueradeSourceCIDRs: in the guard, but excepted.
	mustApply(t, topo, "masqueradeSourceCIDRs: [10.244.1.0/24, \"fd00:1::/64\"]\nnonMasqueradeSourceCIDRs: [10.244.1.3/32, \"fd00:1::3/128\"]\n"+
		"masqueradeCIDRs: [10.250.0.10/32]\n", "--enable-ipv6")
	expect(topo.Pod4, map[string]bool{internet1: true, private1: true, private2: false})
	expect(topo.Pod6, map[string]bool{internet6a: true})
	expect(pod2, map[string]bool{internet1: false, private1: false})
	expect(pod26, map[string]bool{internet6a: false})

	// Literal: no IPv6 entry, no IPv6 traffic masqueraded.
	mustApply(t, topo, "masqueradeSourceCIDRs: [10.244.1.0/24]\n", "--enable-ipv6")
	tableHas("ip6 saddr != @masq-src-v6 counter packets")
	expect(topo.Pod4, map[string]bool{internet1: true})
	expect(pod2, map[string]bool{internet1: true})
	expect(topo.Pod6, map[string]bool{internet6a: false})

	mustApply(t, topo, "masqueradeCIDRs: [10.250.0.10/32]\n", "--enable-ipv6")
	if table := listTable(t, topo); strings.Contains(table, "masq-src") {
		t.Errorf("without masqueradeSourceCIDRs the table still has its sets:\n%s", table)
	}
	expect(pod2, map[string]bool{internet1: true, private1: true, private2: false})
	expect(pod26, map[string]bool{internet6a: true})
	if t.Failed() {
		t.Logf("table:\n%s", listTable(t, topo))
	}
}

// TestConntrackDaemonSourceGuard: after masqueradeSourceCIDRs leaves out
// the second pod's addresses, the daemon's conntrack cleanup deletes that
// pod's masqueraded entries, IPv4 and IPv6 (their next datagram leaves
// unmasqueraded), and keeps the first pod's (same address and port
// throughout).
func TestConntrackDaemonSourceGuard(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, internet1, internet6a)
	if err := topo.EnableConntrack(); err != nil {
		t.Fatal(err)
	}
	pod2, pod26 := netip.MustParseAddr("10.244.1.3"), netip.MustParseAddr("fd00:1::3")
	for _, p := range []string{"10.244.1.3/24", "fd00:1::3/64"} {
		if err := topo.AddPodAddress(netip.MustParsePrefix(p)); err != nil {
			t.Fatal(err)
		}
	}
	cm := newConfigMapDir(t, "resyncInterval: 1h\nmasqueradeSourceCIDRs: [10.244.1.0/24, \"fd00:1::/64\"]\n")
	d := startDaemon(t, topo, "--config", cm.path(), "--http-address=127.0.0.1:0", "--enable-ipv6")
	eventually(t, "the rules", sourcesAre(topo, map[string]bool{internet1: true}))
	first := startUDPStream(t, topo, internet1)
	c, err := topo.DialPodUDPFrom(pod2, netip.MustParseAddr(internet1))
	if err != nil {
		t.Fatalf("udp from %s to %s: %v", pod2, internet1, err)
	}
	second := streamOn(t, c, internet1)
	// Bound to Pod6: with two addresses on the pod's interface, IPv6
	// source selection may take the second.
	f6, err := topo.DialPodUDPFrom(topo.Pod6, netip.MustParseAddr(internet6a))
	if err != nil {
		t.Fatalf("udp from %s to %s: %v", topo.Pod6, internet6a, err)
	}
	first6 := streamOn(t, f6, internet6a)
	c6, err := topo.DialPodUDPFrom(pod26, netip.MustParseAddr(internet6a))
	if err != nil {
		t.Fatalf("udp from %s to %s: %v", pod26, internet6a, err)
	}
	second6 := streamOn(t, c6, internet6a)
	before := first.waitFor(t, topo.NodeUplink4)
	before6 := first6.waitFor(t, topo.NodeUplink6)
	second.waitFor(t, topo.NodeUplink4)
	second6.waitFor(t, topo.NodeUplink6)
	cm.update("resyncInterval: 1h\nmasqueradeSourceCIDRs: [10.244.1.2/32, \"fd00:1::2/128\"]\n")
	eventually(t, "the new config", func() bool { return strings.Contains(d.output(), "applied new config") })
	second.waitFor(t, pod2)
	second6.waitFor(t, pod26)
	first.expectOnly(t, before, 20)
	first6.expectOnly(t, before6, 20)
	eventually(t, "the cleanup logged with its count", func() bool {
		return strings.Contains(d.output(), "conntrack cleanup: examined") && strings.Contains(d.output(), "deleted 2 ")
	})
}

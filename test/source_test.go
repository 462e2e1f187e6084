package test

import (
	"net/netip"
	"strings"
	"testing"
)

// TestPacketsSource proves nonMasqueradeSourceCIDRs with packets: a
// second pod address in the list is never masqueraded, whatever the
// destination (masqueradeCIDRs included), in both families, while the
// first pod's traffic is decided as before; without the key the table has
// no source set and the second pod is masqueraded again.
func TestPacketsSource(t *testing.T) {
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

	const cfg = "nonMasqueradeSourceCIDRs: [10.244.1.3/32, \"fd00:1::3/128\"]\nmasqueradeCIDRs: [10.250.0.10/32]\n"
	mustApply(t, topo, cfg, "--enable-ipv6")
	table := listTable(t, topo)
	for _, want := range []string{"ip saddr @nonmasq-src-v4 counter packets", "ip6 saddr @nonmasq-src-v6 counter packets",
		"elements = { 10.244.1.3 }", "elements = { fd00:1::3 }"} {
		if !strings.Contains(table, want) {
			t.Errorf("nft list lacks %q:\n%s", want, table)
		}
	}
	expect(topo.Pod4, map[string]bool{internet1: true, private1: true, private2: false})
	expect(topo.Pod6, map[string]bool{internet6a: true})
	expect(pod2, map[string]bool{internet1: false, private1: false, private2: false})
	expect(pod26, map[string]bool{internet6a: false})

	mustApply(t, topo, "masqueradeCIDRs: [10.250.0.10/32]\n", "--enable-ipv6")
	if table := listTable(t, topo); strings.Contains(table, "nonmasq-src") {
		t.Errorf("without nonMasqueradeSourceCIDRs the table still has its sets:\n%s", table)
	}
	expect(pod2, map[string]bool{internet1: true, private1: true, private2: false})
	expect(pod26, map[string]bool{internet6a: true})
	if t.Failed() {
		t.Logf("table:\n%s", listTable(t, topo))
	}
}

// TestConntrackDaemonSource: the daemon's conntrack cleanup judges a flow
// by its source. Two UDP streams to one destination, both masqueraded;
// then nonMasqueradeSourceCIDRs lists the second pod's address: its entry
// is deleted (its next datagram leaves unmasqueraded), the first pod's is
// kept (same address and port throughout).
func TestConntrackDaemonSource(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, internet1)
	if err := topo.EnableConntrack(); err != nil {
		t.Fatal(err)
	}
	pod2 := netip.MustParseAddr("10.244.1.3")
	if err := topo.AddPodAddress(netip.MustParsePrefix("10.244.1.3/24")); err != nil {
		t.Fatal(err)
	}
	cm := newConfigMapDir(t, "resyncInterval: 1h\n")
	d := startDaemon(t, topo, "--config", cm.path(), "--http-address=127.0.0.1:0")
	eventually(t, "the rules", sourcesAre(topo, map[string]bool{internet1: true}))
	first := startUDPStream(t, topo, internet1)
	c, err := topo.DialPodUDPFrom(pod2, netip.MustParseAddr(internet1))
	if err != nil {
		t.Fatalf("udp from %s to %s: %v", pod2, internet1, err)
	}
	second := streamOn(t, c, internet1)
	before := first.waitFor(t, topo.NodeUplink4)
	second.waitFor(t, topo.NodeUplink4)
	cm.update("resyncInterval: 1h\nnonMasqueradeSourceCIDRs: [10.244.1.3/32]\n")
	eventually(t, "the new config", func() bool { return strings.Contains(d.output(), "applied new config") })
	second.waitFor(t, pod2)
	first.expectOnly(t, before, 20)
	eventually(t, "the cleanup logged with its count", func() bool {
		return strings.Contains(d.output(), "conntrack cleanup: examined") && strings.Contains(d.output(), "deleted 1 ")
	})
}

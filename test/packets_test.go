package test

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

// Destinations used below, each a host in the external namespace:
// documentation prefixes for the internet, 10.250/16 for a private network
// (inside RFC 1918's 10/8), 169.254.169.254 for link-local (a metadata
// server), and the node's own pod-side address for a local destination.
const (
	internet1  = "203.0.113.10"
	internet2  = "198.51.100.10"
	internet3  = "192.0.2.100"
	private1   = "10.250.0.10"
	private2   = "10.250.0.11"
	linkLocal  = "169.254.169.254"
	nodeLocal  = "10.244.1.1"
	internet6a = "2001:db8:aa::10"
	internet6b = "2001:db8:bb::10"
	private6   = "fd00:250::10"
)

// TestPackets proves each seed's behaviour with packets: for each config,
// which source address each destination sees. The cases run one after the
// other on one node, so each apply also replaces the previous ruleset in
// place.
func TestPackets(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, internet1, internet2, internet3, private1, private2, linkLocal,
		internet6a, internet6b, private6)

	for _, tc := range []struct {
		name   string
		config string
		flags  []string
		want   map[string]bool // destination: masqueraded
	}{{
		name:   "defaults: RFC 1918 and link-local are not masqueraded, the rest is",
		config: "",
		want: map[string]bool{internet1: true, internet2: true, private1: false, linkLocal: false, nodeLocal: false,
			internet6a: false}, // IPv6 is left alone without --enable-ipv6
	}, {
		name:  "reserved ranges with --nomasq-all-reserved-ranges",
		flags: []string{"--nomasq-all-reserved-ranges"},
		want:  map[string]bool{internet1: false, internet2: false, internet3: false, private1: false},
	}, {
		name:   "the Kubernetes docs' example: only 10/8, link-local masqueraded",
		config: "nonMasqueradeCIDRs:\n  - 10.0.0.0/8\nresyncInterval: 60s\nmasqLinkLocal: true\n",
		want:   map[string]bool{private1: false, internet1: true, linkLocal: true, nodeLocal: false},
	}, {
		name:   "a custom list replaces the defaults",
		config: `{"nonMasqueradeCIDRs": ["203.0.113.0/24"]}`,
		want:   map[string]bool{internet1: false, internet2: true, private1: true, linkLocal: false},
	}, {
		name:   "an empty list masquerades everything but link-local",
		config: "nonMasqueradeCIDRs: []\n",
		want:   map[string]bool{private1: true, internet1: true, linkLocal: false, nodeLocal: false},
	}, {
		name:   "masqueradeCIDRs win over nonMasqueradeCIDRs",
		config: "masqueradeCIDRs: [10.250.0.10/32]\n",
		want:   map[string]bool{private1: true, private2: false, internet1: true},
	}, {
		name:   "masqOutBound false: only masqueradeCIDRs are masqueraded",
		config: "masqueradeCIDRs: [198.51.100.0/24]\nmasqOutBound: false\n",
		want:   map[string]bool{internet1: false, internet2: true, private1: false},
	}, {
		name:   "overlapping and duplicate CIDRs",
		config: "nonMasqueradeCIDRs: [10.0.0.0/8, 10.250.0.0/16, 10.250.0.10/32, 10.0.0.0/8, 203.0.113.0/25, 203.0.113.0/24]\n",
		want:   map[string]bool{private1: false, private2: false, internet1: false, internet2: true},
	}, {
		name:   "top of the range: 0.0.0.0/0 is never masqueraded",
		config: "nonMasqueradeCIDRs: [0.0.0.0/0, 240.0.0.0/4]\n",
		want:   map[string]bool{internet1: false, internet2: false, private1: false},
	}, {
		name:   "top of the range: masqueradeCIDRs 0.0.0.0/0 masquerades everything",
		config: "masqueradeCIDRs: [0.0.0.0/0]\n",
		want:   map[string]bool{internet1: true, private1: true, linkLocal: true, nodeLocal: false},
	}, {
		name:  "IPv6: defaults with --enable-ipv6 masquerade all but link-local",
		flags: []string{"--enable-ipv6"},
		want:  map[string]bool{internet6a: true, private6: true, internet1: true, private1: false},
	}, {
		name:   "IPv6: Baidu CCE's own-identity example",
		flags:  []string{"--enable-ipv6"},
		config: "nonMasqueradeCIDRs: [10.0.0.0/8, 172.16.0.0/12, 100.64.230.0/24, 192.168.0.0/16, \"fc00::/7\"]\nmasqOutBound: false\nmasqOutBoundIPv6: true\n",
		want:   map[string]bool{private6: false, internet6a: true, internet1: false, private1: false},
	}, {
		name:   "IPv6: masqueradeCIDRs, nonMasqueradeCIDRs and ::/0",
		flags:  []string{"--enable-ipv6"},
		config: "nonMasqueradeCIDRs: [\"::/0\"]\nmasqueradeCIDRs: [\"2001:db8:bb::/48\"]\n",
		want:   map[string]bool{internet6a: false, internet6b: true, private6: false, internet1: true},
	}, {
		name:   "IPv6: masqOutBoundIPv6 false",
		flags:  []string{"--enable-ipv6"},
		config: "masqOutBoundIPv6: false\nmasqueradeCIDRs: [\"2001:db8:aa::/48\"]\n",
		want:   map[string]bool{internet6a: true, internet6b: false, internet1: true},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			mustApply(t, topo, tc.config, tc.flags...)
			expectSources(t, topo, tc.want)
			if t.Failed() {
				t.Logf("table:\n%s", listTable(t, topo))
			}
		})
	}
}

// TestToPorts checks --to-ports with packets: masqueraded TCP and UDP
// connections leave from a port in one of the ranges, and both ranges are
// used; fully-random is kept alongside the port range.
func TestToPorts(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, internet1)
	mustApply(t, topo, "", "--to-ports", "20000-20099,40000-40099")
	table := listTable(t, topo)
	for _, want := range []string{"masquerade to :20000-20099 fully-random", "masquerade to :40000-40099 fully-random"} {
		if !strings.Contains(table, want) {
			t.Errorf("nft list lacks %q:\n%s", want, table)
		}
	}
	for _, proto := range []string{"tcp", "udp"} {
		low, high := 0, 0
		for i := 0; i < 40; i++ {
			src, err := topo.SourcePortSeen(proto, netip.MustParseAddr(internet1))
			if err != nil {
				t.Fatalf("%s to %s: %v", proto, internet1, err)
			}
			switch {
			case src.Addr() != topo.NodeUplink4:
				t.Fatalf("%s connection arrived from %s, want the node's address", proto, src)
			case src.Port() >= 20000 && src.Port() <= 20099:
				low++
			case src.Port() >= 40000 && src.Port() <= 40099:
				high++
			default:
				t.Fatalf("%s connection arrived from port %d, outside --to-ports", proto, src.Port())
			}
		}
		// Each range has half the ports: 40 tries all landing in one
		// range happen with probability 2^-39.
		if low == 0 || high == 0 {
			t.Errorf("%s: %d connections in 20000-20099 and %d in 40000-40099; want both ranges used", proto, low, high)
		}
		t.Logf("%s: %d connections from 20000-20099, %d from 40000-40099", proto, low, high)
	}
}

// TestCountersCount checks that every rule on the path of a connection
// counts it, including the masquerade rule (a counter after masquerade
// would never count).
func TestCountersCount(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, internet1, private1)
	mustApply(t, topo, "")
	expectSources(t, topo, map[string]bool{internet1: true, private1: false})
	table := listTable(t, topo)
	for _, rule := range []string{"fib daddr type != local", "ip daddr @nonmasq-v4", "meta nfproto ipv4", "masquerade fully-random"} {
		line := lineWith(table, rule)
		if line == "" || strings.Contains(line, "counter packets 0 ") {
			t.Errorf("rule %q did not count the connection: %q", rule, line)
		}
	}
}

func lineWith(s, substr string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

// TestHundredThousandCIDRs applies 100,000 CIDRs (cidrLimit: 100000): far
// past the 64 KiB a netlink attribute can hold, so elements must go in
// chunks, or the kernel would silently keep a fragment.
func TestHundredThousandCIDRs(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, internet1, internet2, "100.66.134.160", "100.66.134.161")
	var b strings.Builder
	b.WriteString("cidrLimit: 100000\nnonMasqueradeCIDRs:\n")
	// 100,000 /32s in 100.64.0.0/10 (every other address, so none are
	// adjacent), then 203.0.113.0/24 last.
	for i := 0; i < 99_999; i++ {
		n := 100<<24 | 64<<16 + uint32(2*i)
		fmt.Fprintf(&b, "- %d.%d.%d.%d/32\n", n>>24, n>>16&255, n>>8&255, n&255)
	}
	b.WriteString("- 203.0.113.0/24\n")
	mustApply(t, topo, b.String())

	// 100.66.134.160 is the 99,920th CIDR: deep in the last chunks.
	expectSources(t, topo, map[string]bool{"100.66.134.160": false, "100.66.134.161": true, internet1: false, internet2: true})
	out, err := topo.NFT("--json", "list", "set", "inet", "ip-masq-agent", "nonmasq-v4")
	if err != nil {
		t.Fatal(err)
	}
	// Each element appears as {"prefix"...} or a plain address; count
	// the addresses of the 100.64/10 /32s plus the /24 and link-local.
	if n := strings.Count(out, `"100.`); n != 99_999 {
		t.Errorf("nft lists %d elements in 100.64.0.0/10, want 99999", n)
	}
}

// TestLinkLocalIPv6 checks fe80::/10 with packets. The kernel never forwards
// a packet to a link-local destination out of another interface, so pods
// cannot reach one through the node; the node's own traffic can, and passes
// the same postrouting chain: from the node's fd00:1::1, fe80::aa sees that
// address unless masqLinkLocalIPv6 masquerades it to the uplink's own
// link-local address.
func TestLinkLocalIPv6(t *testing.T) {
	topo := newTopology(t)
	dst := netip.MustParseAddr("fe80::aa")
	addDestinations(t, topo, dst.String())
	for _, tc := range []struct {
		config string
		masq   bool
	}{
		{"", false},
		{"masqLinkLocalIPv6: true\n", true},
		{"masqLinkLocalIPv6: false\nmasqLinkLocal: true\n", false},
	} {
		mustApply(t, topo, tc.config, "--enable-ipv6")
		got, err := topo.SourceSeenFromNode(topo.NodePodSide6, dst)
		if err != nil {
			t.Fatalf("config %q: connect to %s: %v", tc.config, dst, err)
		}
		masqueraded := got != topo.NodePodSide6
		if masqueraded != tc.masq || (masqueraded && !got.IsLinkLocalUnicast()) {
			t.Errorf("config %q: %s saw source %s; want masqueraded=%v (to a link-local address)", tc.config, dst, got, tc.masq)
		}
	}
}

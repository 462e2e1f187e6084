package test

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
)

// The node's second address on its uplink, for snatAddress: in the
// uplink's subnets, so that ext reaches it as it reaches the uplink's own.
var (
	snat4 = netip.MustParsePrefix("192.0.2.10/24")
	snat6 = netip.MustParsePrefix("2001:db8:1::10/64")
)

const snatConfig = "nonMasqueradeCIDRs: []\nsnatAddress: 192.0.2.10\nsnatAddressIPv6: \"2001:db8:1::10\"\n"

// TestPacketsSNAT proves snatAddress and snatAddressIPv6 with packets: a
// destination behind the uplink sees the snat address, not the uplink's
// own, in both families; traffic that passes through the node out of
// another interface (here from ext to the pod, masqueraded with
// nonMasqueradeCIDRs: []) is masqueraded to that interface's address as
// before, not to the snat address, and keeps working; without the
// address on the node nothing is source-NATed to it; render's table is
// the daemon's, loaded by nft, and explain says where.
func TestPacketsSNAT(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, internet1, internet6a)
	expect := func(what string, seen func() (netip.Addr, error), want netip.Addr) {
		t.Helper()
		got, err := seen()
		if err != nil {
			t.Errorf("%s: %v", what, err)
		} else if got != want {
			t.Errorf("%s: saw source %s, want %s", what, got, want)
		}
	}
	to := func(dst string) func() (netip.Addr, error) {
		return func() (netip.Addr, error) { return topo.SourceSeen(netip.MustParseAddr(dst)) }
	}
	atPod := func(dst netip.Addr) func() (netip.Addr, error) {
		return func() (netip.Addr, error) { return topo.SourceSeenAtPod(dst) }
	}

	// The address on no interface: masquerade as without it, and a warning.
	out, err := runAgent(t, topo, "--once", "--config", writeConfig(t, snatConfig), "--enable-ipv6")
	if err != nil || !strings.Contains(out, "snatAddress 192.0.2.10 is on no interface of this node") {
		t.Errorf("without the address: %v\n%s", err, out)
	}
	if table := listTable(t, topo); strings.Contains(table, "snat") {
		t.Errorf("snat rules for an address on no interface:\n%s", table)
	}
	expect("pod to "+internet1+", no snat address on the node", to(internet1), topo.NodeUplink4)

	for _, p := range []netip.Prefix{snat4, snat6} {
		if err := topo.AddNodeAddress(testnet.NodeUplinkIf, p); err != nil {
			t.Fatal(err)
		}
	}
	mustApply(t, topo, snatConfig, "--enable-ipv6")
	table := listTable(t, topo)
	for _, want := range []string{`meta nfproto ipv4 oifname "eth0" ct label set 20 counter packets`, "snat ip to 192.0.2.10 fully-random",
		`meta nfproto ipv6 oifname "eth0" ct label set 20 counter packets`, "snat ip6 to 2001:db8:1::10 fully-random",
		"masquerade fully-random"} {
		if !strings.Contains(table, want) {
			t.Errorf("nft list lacks %q:\n%s", want, table)
		}
	}
	expect("pod to "+internet1, to(internet1), snat4.Addr())
	expect("pod to "+internet6a, to(internet6a), snat6.Addr())
	// Through the node to the pod: out of veth-pod, which does not hold
	// the address: masqueraded to veth-pod's own, as before.
	expect("ext to the pod", atPod(topo.Pod4), topo.NodePodSide4)
	expect("ext to the pod (IPv6)", atPod(topo.Pod6), topo.NodePodSide6)

	// render, in the node's namespace, is the daemon's table; nft loads it.
	code, rendered, stderr := runTool(t, topo, "render", "--config", writeConfig(t, snatConfig), "--enable-ipv6")
	if code != 0 {
		t.Fatalf("render: exit %d: %s", code, stderr)
	}
	file := filepath.Join(t.TempDir(), "ruleset.nft")
	if err := os.WriteFile(file, []byte(rendered), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := testnet.Exec(topo.ExtNS, "nft", "-f", file); err != nil {
		t.Fatalf("nft -f render's output: %v\n%s\n%s", err, out, rendered)
	}
	loaded, err := testnet.Exec(topo.ExtNS, "nft", "list", "table", "inet", "ip-masq-agent")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := withoutCounters(listTable(t, topo)), withoutCounters(string(loaded)); got != want {
		t.Errorf("the daemon's table:\n%s\nrender's, loaded with nft -f:\n%s", got, want)
	}
	if code, out, stderr := runTool(t, topo, "diff", "--config", writeConfig(t, snatConfig), "--enable-ipv6"); code != 0 || out != "in sync\n" {
		t.Errorf("diff: exit %d, %q %s", code, out, stderr)
	}
	if code, out, _ := runTool(t, topo, "explain", "--config", writeConfig(t, snatConfig), internet1); code != 0 ||
		!strings.Contains(out, "masquerade to 192.0.2.10 (snatAddress) through eth0, to the out interface's address through others") {
		t.Errorf("explain: %d %q", code, out)
	}

	// Without the keys, the uplink's own address again.
	mustApply(t, topo, "nonMasqueradeCIDRs: []\n", "--enable-ipv6")
	expect("pod to "+internet1+" without snatAddress", to(internet1), topo.NodeUplink4)
	// (IPv6's masquerade takes the uplink's address by source address
	// selection, which may be the second address of the same /64.)
	if table := listTable(t, topo); strings.Contains(table, "snat") {
		t.Errorf("snat rules without the keys:\n%s", table)
	}
	if t.Failed() {
		t.Logf("table:\n%s", listTable(t, topo))
	}
}

// TestConntrackDaemonSNAT: a change of snatAddress moves an established
// UDP flow. A stream from the pod is source-NATed to the first address;
// the config names a second one: the daemon deletes the entry NATed to
// the first (its log says so), and the stream's next datagrams leave from
// the second. Then the key goes: the stream moves to the uplink's own
// address (masquerade), as a stream started then would.
func TestConntrackDaemonSNAT(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, internet1)
	if err := topo.EnableConntrack(); err != nil {
		t.Fatal(err)
	}
	second := netip.MustParsePrefix("192.0.2.11/24")
	for _, p := range []netip.Prefix{snat4, second} {
		if err := topo.AddNodeAddress(testnet.NodeUplinkIf, p); err != nil {
			t.Fatal(err)
		}
	}
	cm := newConfigMapDir(t, "resyncInterval: 1h\nsnatAddress: 192.0.2.10\n")
	d := startDaemon(t, topo, "--config", cm.path(), "--http-address=127.0.0.1:0")
	eventually(t, "the snat rule", func() bool {
		out, err := topo.NFT("list", "chain", "inet", "ip-masq-agent", "masq-to-node")
		return err == nil && strings.Contains(out, "snat ip to 192.0.2.10")
	})
	s := startUDPStream(t, topo, internet1)
	s.waitFor(t, snat4.Addr())
	cm.update("resyncInterval: 1h\nsnatAddress: 192.0.2.11\n")
	s.waitFor(t, second.Addr())
	eventually(t, "the cleanup logged", func() bool {
		return strings.Contains(d.output(), "conntrack cleanup after a change of snatAddress: examined") &&
			strings.Contains(d.output(), "deleted 1 ") && strings.Contains(d.output(), "from=[192.0.2.10]")
	})
	cm.update("resyncInterval: 1h\n")
	s.waitFor(t, topo.NodeUplink4)
}

// TestPacketsSNATPorts: with --to-ports and --random-fully=false the snat
// rules take the port ranges as masquerade does; the kernel's table reads
// back as the agent's (diff in sync), render's loads as the same, and the
// destination sees the address with a port of the ranges.
func TestPacketsSNATPorts(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, internet1, internet6a)
	for _, p := range []netip.Prefix{snat4, snat6} {
		if err := topo.AddNodeAddress(testnet.NodeUplinkIf, p); err != nil {
			t.Fatal(err)
		}
	}
	flags := []string{"--enable-ipv6", "--to-ports", "20000-20999,30000-30999", "--random-fully=false"}
	path := writeConfig(t, snatConfig)
	mustApply(t, topo, snatConfig, flags...)
	table := listTable(t, topo)
	for _, want := range []string{"snat ip to 192.0.2.10:20000-20999", "snat ip6 to [2001:db8:1::10]:30000-30999", "numgen random mod 2000 < 1000"} {
		if !strings.Contains(table, want) {
			t.Errorf("nft list lacks %q:\n%s", want, table)
		}
	}
	if code, out, stderr := runTool(t, topo, append([]string{"diff", "--config", path}, flags...)...); code != 0 || out != "in sync\n" {
		t.Errorf("diff: exit %d, %q %s", code, out, stderr)
	}
	code, rendered, stderr := runTool(t, topo, append([]string{"render", "--config", path}, flags...)...)
	if code != 0 {
		t.Fatalf("render: exit %d: %s", code, stderr)
	}
	file := filepath.Join(t.TempDir(), "ruleset.nft")
	if err := os.WriteFile(file, []byte(rendered), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := testnet.Exec(topo.ExtNS, "nft", "-f", file); err != nil {
		t.Fatalf("nft -f render's output: %v\n%s\n%s", err, out, rendered)
	}
	loaded, err := testnet.Exec(topo.ExtNS, "nft", "list", "table", "inet", "ip-masq-agent")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := withoutCounters(table), withoutCounters(string(loaded)); got != want {
		t.Errorf("the daemon's table:\n%s\nrender's, loaded with nft -f:\n%s", got, want)
	}
	for _, dst := range []string{internet1, internet6a} {
		ap, err := topo.SourcePortSeen("tcp", netip.MustParseAddr(dst))
		want := snat4.Addr()
		if netip.MustParseAddr(dst).Is6() {
			want = snat6.Addr()
		}
		if p := ap.Port(); err != nil || ap.Addr() != want || !(p >= 20000 && p <= 20999 || p >= 30000 && p <= 30999) {
			t.Errorf("to %s: saw %s (%v), want %s with a port of the ranges", dst, ap, err, want)
		}
	}
}

// TestPacketsSNATOtherInterface is the kernel's behaviour behind the
// design: the node's second link leads to a network that routes only its
// own prefixes (an overlay peer, a second NIC's network). A source NAT to
// the uplink's address out of that link, as a rule of the test's own
// makes it (unguarded, at srcnat, before the agent's chain), gets no
// answer: the connection fails. The agent's snatAddress, through the
// uplink only, leaves that traffic masqueraded to the link's own address:
// it works, in both families, while the uplink's traffic leaves from the
// snat address.
func TestPacketsSNATOtherInterface(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, internet1, internet6a)
	peer, err := topo.AddPeer()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []netip.Prefix{snat4, snat6} {
		if err := topo.AddNodeAddress(testnet.NodeUplinkIf, p); err != nil {
			t.Fatal(err)
		}
	}
	// Unguarded: the replies to 192.0.2.10 never come back from the peer.
	const unguarded = `table inet test-unguarded {
	chain c {
		type nat hook postrouting priority srcnat; policy accept;
		oifname "eth1" meta nfproto ipv4 snat ip to 192.0.2.10
		oifname "eth1" meta nfproto ipv6 snat ip6 to 2001:db8:1::10
	}
}
`
	file := filepath.Join(t.TempDir(), "unguarded.nft")
	if err := os.WriteFile(file, []byte(unguarded), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := testnet.Exec(topo.NodeNS, "nft", "-f", file); err != nil {
		t.Fatalf("nft -f: %v\n%s", err, out)
	}
	for _, dst := range []netip.Addr{testnet.PeerAddr4, testnet.PeerAddr6} {
		if got, err := topo.SourceSeenAtPeer(peer, dst); err == nil {
			t.Errorf("unguarded snat out of the peer's link: %s answered, seeing %s; want no answer", dst, got)
		}
	}
	if out, err := testnet.Exec(topo.NodeNS, "nft", "delete", "table", "inet", "test-unguarded"); err != nil {
		t.Fatalf("nft delete: %v\n%s", err, out)
	}

	mustApply(t, topo, "snatAddress: 192.0.2.10\nsnatAddressIPv6: \"2001:db8:1::10\"\n", "--enable-ipv6")
	for dst, want := range map[netip.Addr]netip.Addr{testnet.PeerAddr4: testnet.PeerNode4, testnet.PeerAddr6: testnet.PeerNode6} {
		if got, err := topo.SourceSeenAtPeer(peer, dst); err != nil || got != want {
			t.Errorf("pod to the peer %s: saw %s (%v), want %s (the link's own address)", dst, got, err, want)
		}
	}
	for dst, want := range map[string]netip.Addr{internet1: snat4.Addr(), internet6a: snat6.Addr()} {
		if got, err := topo.SourceSeen(netip.MustParseAddr(dst)); err != nil || got != want {
			t.Errorf("pod to %s: saw %s (%v), want %s", dst, got, err, want)
		}
	}
	if t.Failed() {
		t.Logf("table:\n%s", listTable(t, topo))
	}
}

// TestPacketsSNATDNAT: traffic DNAT'ed on the node, as kube-proxy does for
// a Service or a NodePort and a CNI for a hostPort (a table of the test's
// own at dstnat). A pod's connection to the node's address DNAT'ed to a
// backend behind the uplink leaves through the uplink: source-NATed to the
// snat address, like any traffic through it, and answered. A connection
// from outside to the node's address DNAT'ed to the pod leaves through the
// pod's interface: masqueraded to that interface's address, as without
// the key (nonMasqueradeCIDRs: [] makes it masqueraded), and answered.
func TestPacketsSNATDNAT(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, internet1)
	if err := topo.AddNodeAddress(testnet.NodeUplinkIf, snat4); err != nil {
		t.Fatal(err)
	}
	const dnat = `table ip test-dnat {
	chain pre {
		type nat hook prerouting priority dstnat; policy accept;
		iifname "veth-pod" ip daddr 192.0.2.1 tcp dport 8080 dnat to 203.0.113.10
		iifname "eth0" ip daddr 192.0.2.1 tcp dport 8080 dnat to 10.244.1.2
	}
}
`
	file := filepath.Join(t.TempDir(), "dnat.nft")
	if err := os.WriteFile(file, []byte(dnat), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := testnet.Exec(topo.NodeNS, "nft", "-f", file); err != nil {
		t.Fatalf("nft -f: %v\n%s", err, out)
	}
	mustApply(t, topo, "nonMasqueradeCIDRs: []\nsnatAddress: 192.0.2.10\n")
	// (directly first: that starts the backend's server)
	if got, err := topo.SourceSeen(netip.MustParseAddr(internet1)); err != nil || got != snat4.Addr() {
		t.Errorf("pod to %s: saw %s (%v), want %s", internet1, got, err, snat4.Addr())
	}
	if got, err := topo.SourceSeen(topo.NodeUplink4); err != nil || got != snat4.Addr() {
		t.Errorf("pod to the node's address, DNAT'ed to %s: saw %s (%v), want %s", internet1, got, err, snat4.Addr())
	}
	if got, err := topo.SourceSeenAtPod(topo.NodeUplink4); err != nil || got != topo.NodePodSide4 {
		t.Errorf("ext to the node's address, DNAT'ed to the pod: saw %s (%v), want %s", got, err, topo.NodePodSide4)
	}
	if t.Failed() {
		t.Logf("table:\n%s", listTable(t, topo))
	}
}

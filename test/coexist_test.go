package test

import (
	"strings"
	"testing"

	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// repairLine is what the agent logs when it puts its table back after
// another process changed it (internal/agent, reportRepair).
const repairLine = "the table differed from the wanted one; put it back"

// The other programs' tables in the node namespace, as a CNI plugin and
// kube-proxy would have them.
const (
	// A kube-proxy-like table (nftables mode): service traffic marked
	// 0x4000 is masqueraded at srcnat, before the agent (srcnat + 10).
	// Here the mark is set for one destination, as kube-proxy's
	// mark-for-masquerade does for service traffic.
	kubeProxyTable = `table ip kube-proxy {
	chain mark-for-masquerade {
		type filter hook prerouting priority mangle; policy accept;
		ip daddr 10.250.0.11 meta mark set meta mark | 0x00004000
	}
	chain nat-postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		meta mark & 0x00004000 == 0x00004000 masquerade
	}
}
`
	// A table of the same name as the agent's, in another family: not the
	// agent's, never to be touched.
	sameNameTable = `table ip ip-masq-agent {
	set foreign {
		type ipv4_addr
		elements = { 192.0.2.200 }
	}
	chain c {
		ip daddr @foreign counter
	}
}
`
	// Added while the agent runs: another CNI's table at the same hook.
	lateTable = `table inet late-cni {
	chain post {
		type nat hook postrouting priority srcnat - 10; policy accept;
		ip daddr 192.0.2.201 counter masquerade
	}
}
`
)

// TestCoexistence runs the agent next to a CNI-style masquerade rule in
// iptables' nat POSTROUTING (written by iptables-nft), a kube-proxy-like table at the same hook, and a
// table named ip-masq-agent in another family, all there before the agent
// starts, and one more added while it runs. The agent's syncs, config
// changes and repairs leave each of them byte for byte as it was (handles
// included), and packets show the README's ordering: the first NAT chain to
// masquerade a connection wins, and a connection the earlier chains leave
// alone gets the agent's decision.
func TestCoexistence(t *testing.T) {
	testnet.Require(t, "iptables-nft", "iptables-nft-save")
	topo := newTopology(t)
	if err := topo.EnableConntrack(); err != nil {
		t.Fatal(err)
	}
	addDestinations(t, topo, internet1, internet2, private1, private2, "10.251.0.10")

	// The CNI's rule: masquerade pod traffic leaving 10.0.0.0/8.
	if out, err := testnet.Exec(topo.NodeNS, "iptables-nft", "-t", "nat", "-A", "POSTROUTING",
		"-s", "10.244.0.0/16", "!", "-d", "10.0.0.0/8", "-j", "MASQUERADE"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	nftFile(t, topo, kubeProxyTable+sameNameTable)

	foreign := []string{"ip nat", "ip kube-proxy", "ip ip-masq-agent"}
	before := foreignState(t, topo, foreign)

	cm := newConfigMapDir(t, "resyncInterval: 1s\nnonMasqueradeCIDRs: [10.0.0.0/8]\nmasqueradeCIDRs: [10.251.0.0/24]\n")
	d := startDaemon(t, topo, "--config", cm.path(), "--http-address=127.0.0.1:0", "--own-table=false")
	waitOutcome(t, d, 0, "the first sync")
	// Resyncs, a config change, a repair: no traffic meanwhile, so that
	// even the counters must be unchanged.
	eventually(t, "three resyncs", func() bool { return strings.Count(d.output(), "resync:") >= 3 })
	mark := len(d.output())
	cm.update("resyncInterval: 1s\nnonMasqueradeCIDRs: [10.0.0.0/8, 198.51.100.0/24]\nmasqueradeCIDRs: [10.251.0.0/24]\n")
	waitOutcome(t, d, mark, "the config change")
	if out, err := topo.NFT("flush", "chain", "inet", nft.TableName, nft.DefaultChain); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	eventually(t, "the repair", func() bool { return strings.Contains(d.output(), repairLine) })
	if after := foreignState(t, topo, foreign); after != before {
		t.Errorf("the agent changed the other tables:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	// Packets: who decides.
	expectSources(t, topo, map[string]bool{
		internet1:     true,  // the CNI masquerades (the agent would too)
		internet2:     true,  // the agent says no (nonMasqueradeCIDRs); the CNI's earlier masquerade wins
		private2:      true,  // kube-proxy's mark: its earlier masquerade wins over the agent's "no"
		private1:      false, // nobody before the agent NATs it; the agent returns: not masqueraded
		"10.251.0.10": true,  // nobody before the agent NATs it; the agent's masqueradeCIDRs masquerade it
	})

	// Another program adds its table, and edits its own, while the agent
	// runs: not a change to the agent's table, no repair.
	repairs := strings.Count(d.output(), repairLine)
	if repairs == 0 {
		t.Fatalf("no %q line for the flush of the agent's chain:\n%s", repairLine, d.output())
	}
	nftFile(t, topo, lateTable)
	if out, err := topo.NFT("add", "element", "ip", "ip-masq-agent", "foreign", "{ 192.0.2.202 }"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	foreign = append(foreign, "inet late-cni")
	before = foreignState(t, topo, foreign)
	resyncs := strings.Count(d.output(), "resync:")
	eventually(t, "two more resyncs", func() bool { return strings.Count(d.output(), "resync:") >= resyncs+2 })
	if n := strings.Count(d.output(), repairLine); n != repairs {
		t.Errorf("the agent took other tables' changes for tampering: %d repairs, want %d", n, repairs)
	}
	if after := foreignState(t, topo, foreign); after != before {
		t.Errorf("the agent changed the other tables:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	// Without the agent's table, only the others decide: the agent's
	// masqueradeCIDRs no longer apply, the CNI still masquerades.
	d.stop(t)
	if out, err := runAgent(t, topo, "--cleanup"); err != nil {
		t.Fatalf("--cleanup: %v\n%s", err, out)
	}
	if after := foreignState(t, topo, foreign); after != before {
		t.Errorf("--cleanup changed the other tables:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	expectSources(t, topo, map[string]bool{internet2: true, private2: true, private1: false, "10.251.0.10": false})
	t.Logf("CNI rule by iptables-nft, kube-proxy-like table, table ip ip-masq-agent and a late inet table: unchanged (handles and counters) "+
		"through %d resyncs, a config change, %d repair(s) and --cleanup; the earlier masquerades won, the agent decided the rest",
		strings.Count(d.output(), "resync:"), repairs)
}

// nftFile loads an nft script in the node namespace.
func nftFile(t *testing.T, topo *testnet.Topology, script string) {
	t.Helper()
	if out, err := topo.NFT("-f", writeConfig(t, script)); err != nil {
		t.Fatalf("nft -f: %v\n%s\n%s", err, out, script)
	}
}

// foreignState lists the given tables with handles and counters, and
// iptables-nft's view of nat.
func foreignState(t *testing.T, topo *testnet.Topology, tables []string) string {
	t.Helper()
	var b strings.Builder
	for _, tab := range tables {
		out, err := topo.NFT(append([]string{"-a", "list", "table"}, strings.Fields(tab)...)...)
		if err != nil {
			t.Fatalf("nft list table %s: %v\n%s", tab, err, out)
		}
		b.WriteString(out)
	}
	out, err := testnet.Exec(topo.NodeNS, "iptables-nft-save", "-c", "-t", "nat")
	if err != nil {
		t.Fatalf("iptables-nft-save: %v\n%s", err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if !strings.HasPrefix(l, "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

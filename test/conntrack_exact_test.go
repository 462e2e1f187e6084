package test

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// The conntrack cleanup is exact (issue 18): every change of what the
// kernel decides reaches running flows, also one made while no agent ran
// or by a repair, and no flow that another component masquerades is
// touched.

// internetSame24 is a second destination in internet1's /24: the agent
// masquerades it while a kube-proxy-like chain masquerades internet1.
const internetSame24 = "203.0.113.20"

const nomasq203 = "resyncInterval: 1h\nnonMasqueradeCIDRs: [10.0.0.0/8, 203.0.113.0/24]\n"

// TestConntrackChangeWhileStopped: the ConfigMap changes while no agent
// runs; the next agent's first sync cleans against the table it found,
// both ways.
func TestConntrackChangeWhileStopped(t *testing.T) {
	for _, tc := range []struct {
		name     string
		from, to string
		masqFrom bool
	}{
		{"masquerade to not", "resyncInterval: 1h\n", nomasq203, true},
		{"not to masquerade", nomasq203, "resyncInterval: 1h\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			topo := newTopology(t)
			addDestinations(t, topo, internet1)
			if err := topo.EnableConntrack(); err != nil {
				t.Fatal(err)
			}
			src := map[bool]netip.Addr{true: topo.NodeUplink4, false: topo.Pod4}
			cm := newConfigMapDir(t, tc.from)
			d := startDaemon(t, topo, "--config", cm.path(), "--http-address=127.0.0.1:0")
			waitStarted(t, d)
			eventually(t, "the rules", sourcesAre(topo, map[string]bool{internet1: tc.masqFrom}))
			s := startUDPStream(t, topo, internet1)
			before := s.waitFor(t, src[tc.masqFrom])
			d.stop(t)
			cm.update(tc.to)
			s.expectOnly(t, before, 4) // nothing changes while no agent runs
			d2 := startDaemon(t, topo, "--config", cm.path(), "--http-address=127.0.0.1:0")
			// The new agent's first apply and its cleanup first: the
			// stream's wait is for the answers after them, not for the
			// agent's start (in an emulated guest that alone took longer
			// than the stream's wait, on 6.1: the test failed there).
			eventually(t, "the cleanup's log line", func() bool { return strings.Contains(d2.output(), "conntrack cleanup: examined") })
			s.waitFor(t, src[!tc.masqFrom])
		})
	}
}

// TestConntrackAfterRepair: with --own-table=false, a flow that starts
// while the table is gone, or while a foreign return sits at the top of
// the decision chain, leaves unmasqueraded; the repair cleans against what
// the kernel held, and the flow is masqueraded. The agent is stopped
// (SIGSTOP) while the table is tampered with, so that the flow starts
// before the repair.
func TestConntrackAfterRepair(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tamper []string // nft arguments
	}{
		{"table deleted and re-created", []string{"delete", "table", "inet", nft.TableName}},
		// (a plain "counter return" is a rule the agent could write: not foreign)
		{"foreign return removed", []string{"insert", "rule", "inet", nft.TableName, nft.DefaultChain, "ip", "daddr", "203.0.113.0/24", "counter", "return"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			topo := newTopology(t)
			addDestinations(t, topo, internet1)
			if err := topo.EnableConntrack(); err != nil {
				t.Fatal(err)
			}
			cm := newConfigMapDir(t, "resyncInterval: 1h\n")
			d := startDaemon(t, topo, "--config", cm.path(), "--http-address=127.0.0.1:0", "--own-table=false")
			waitStarted(t, d)
			eventually(t, "the rules", sourcesAre(topo, map[string]bool{internet1: true}))
			mark := len(d.output())
			if err := d.Cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			cont := func() { d.Cmd.Process.Signal(syscall.SIGCONT) }
			t.Cleanup(cont)
			if out, err := topo.NFT(tc.tamper...); err != nil {
				cont()
				t.Fatalf("nft %v: %v\n%s", tc.tamper, err, out)
			}
			s := startUDPStream(t, topo, internet1)
			s.waitFor(t, topo.Pod4) // leaves unmasqueraded while the agent is stopped
			cont()
			eventually(t, "the repair", func() bool { return strings.Contains(d.output()[mark:], "put it back") })
			s.waitFor(t, topo.NodeUplink4)
		})
	}
}

// waitStarted waits until the agent has made its first sync (and its
// cleanup) and watches the kernel's notifications: it verified the table
// after the watch started.
func waitStarted(t *testing.T, d *daemon) {
	t.Helper()
	eventually(t, "the agent's start", func() bool {
		return strings.Contains(d.output(), "verified the table after an nftables event")
	})
}

// kubeProxyLike masquerades, at priority srcnat (before the agent), the
// traffic to internet1 that a prerouting chain marks with 0x4000, as
// kube-proxy's KUBE-MARK-MASQ and KUBE-POSTROUTING do.
const kubeProxyLike = `table ip kubeproxylike {
	chain premark {
		type filter hook prerouting priority mangle; policy accept;
		ip daddr ` + internet1 + ` meta mark set meta mark | 0x4000
	}
	chain post {
		type nat hook postrouting priority srcnat; policy accept;
		meta mark & 0x4000 == 0x4000 masquerade fully-random
	}
}
`

func loadKubeProxyLike(t *testing.T, topo *testnet.Topology) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "kubeproxylike.nft")
	if err := os.WriteFile(file, []byte(kubeProxyLike), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := topo.NFT("-f", file); err != nil {
		t.Fatalf("nft -f kubeproxylike: %v\n%s", err, out)
	}
}

// TestConntrackKeepsOthersMasquerade: a masquerade → return change for
// 203.0.113.0/24 undoes the agent's masquerade of a flow to
// internetSame24 and leaves kube-proxy's masquerade of a flow to
// internet1 alone: a UDP stream (default mode) keeps its source address
// and port; an established TCP connection survives --conntrack-cleanup=all.
func TestConntrackKeepsOthersMasquerade(t *testing.T) {
	// start: kube-proxy's rules, then the agent's (internetSame24
	// masqueraded) in force.
	start := func(t *testing.T, args ...string) (*testnet.Topology, *configMapDir, *daemon) {
		topo := newTopology(t)
		addDestinations(t, topo, internet1, internetSame24)
		if err := topo.EnableConntrack(); err != nil {
			t.Fatal(err)
		}
		loadKubeProxyLike(t, topo)
		cm := newConfigMapDir(t, "resyncInterval: 1h\n")
		d := startDaemon(t, topo, append([]string{"--config", cm.path(), "--http-address=127.0.0.1:0"}, args...)...)
		waitStarted(t, d)
		eventually(t, "the rules", sourcesAre(topo, map[string]bool{internetSame24: true}))
		return topo, cm, d
	}
	t.Run("udp", func(t *testing.T) {
		topo, cm, d := start(t)
		theirs := startUDPStream(t, topo, internet1)
		ours := startUDPStream(t, topo, internetSame24)
		theirSrc := theirs.waitFor(t, topo.NodeUplink4)
		ours.waitFor(t, topo.NodeUplink4)
		cm.update(nomasq203)
		ours.waitFor(t, topo.Pod4) // the cleanup ran
		theirs.expectOnly(t, theirSrc, 20)
		if !strings.Contains(d.output(), "marked=true") {
			t.Errorf("the cleanup does not say it used the mark:\n%s", d.output())
		}
	})
	t.Run("tcp, all", func(t *testing.T) {
		topo, cm, d := start(t, "--conntrack-cleanup=all")
		theirs, theirR := connectTCP(t, topo, internet1, topo.NodeUplink4)
		ours, ourR := connectTCP(t, topo, internetSame24, topo.NodeUplink4)
		theirLocal := theirs.LocalAddr().String()
		mark := len(d.output())
		cm.update(nomasq203)
		eventually(t, "the cleanup", func() bool {
			_, after, ok := strings.Cut(d.output()[mark:], "applied new config")
			return ok && strings.Contains(after, "conntrack cleanup: examined")
		})
		echo(t, ours, ourR, false)    // the agent's masquerade is undone: cut
		echo(t, theirs, theirR, true) // kube-proxy's is not: the connection survives
		if got := theirs.LocalAddr().String(); got != theirLocal {
			t.Errorf("the connection moved from %s to %s", theirLocal, got)
		}
	})
}

package test

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/harness"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
)

// startDaemonLimited starts the agent in a cgroup whose CPU quota is
// percent of one CPU, as the DaemonSet's limit (100m) is 10.
func startDaemonLimited(t *testing.T, topo *testnet.Topology, percent int, args ...string) *daemon {
	t.Helper()
	g, err := testnet.NewCPUGroup(strings.ReplaceAll(t.Name(), "/", "-"), percent)
	if err != nil {
		t.Fatalf("a cgroup with a CPU quota (root, cgroup cpu controller): %v", err)
	}
	// The shell moves itself into the group before `ip netns exec`, whose
	// own /sys has no cgroup mounts; the agent inherits the group.
	argv := g.Wrap(append([]string{"ip", "netns", "exec", topo.NodeNS, agentBin, "--v=2"}, args...)...)
	d := startCommand(t, exec.Command(argv[0], argv[1:]...), false) // sh and ip exec the agent: SIGTERM reaches it
	t.Cleanup(func() {
		d.stop(t)
		t.Logf("throttled by the quota for %s", g.Throttled())
		if err := g.Close(); err != nil {
			t.Errorf("remove the cgroup: %v", err)
		}
	})
	return d
}

// TestBusyNode: the agent under the DaemonSet's CPU limit (10% of a CPU),
// a large table (100,000 CIDRs under `make soak`), and a neighbour
// committing to its own table: over netlink 20 times a second, or running
// the nft command as fast as it can (kube-proxy's nftables mode; nft reads
// every element of the agent's sets before each of its batches). A
// one-CIDR config change reaches the kernel, no sync fails, and /healthz
// and /readyz answer 200 throughout: commits to other tables are no reason
// to read the table again, and a busy node is no reason for the kubelet
// to restart the agent. Owned (the table cannot change behind the agent's
// back) and not owned (kernels before 6.9: the agent learns from the
// kernel's notifications what touched its table).
func TestBusyNode(t *testing.T) {
	n := 10000
	if soakMode() {
		n = 100000
	}
	for _, c := range []struct {
		own bool
		nft bool
	}{{true, false}, {false, false}, {true, true}, {false, true}} {
		own := c.own
		name := fmt.Sprintf("own-table=%v", own)
		if c.nft {
			name += "/nft-neighbour"
		}
		t.Run(name, func(t *testing.T) {
			topo := newTopology(t)
			cm := newConfigMapDir(t, "resyncInterval: 2s\n"+manyCIDRs(n))
			d := startDaemonLimited(t, topo, 10, "--config", cm.path(), fmt.Sprintf("--own-table=%v", own))
			eventually(t, "the first apply", func() bool { return strings.Contains(d.output(), "msg=\"applied config\"") })
			var neighbour *testnet.Neighbour
			var err error
			if c.nft {
				neighbour, err = testnet.NewNFTNeighbour(topo.NodeNS)
			} else {
				neighbour, err = testnet.NewNeighbour(topo.NodeHandle(), 50*time.Millisecond)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer neighbour.Stop()
			p := harness.WatchProbes(topo.NodeHTTPClient(), 100*time.Millisecond, "/healthz", "/readyz")
			mark := len(d.output())
			// Resyncs run meanwhile (every 2 s): wait for two with the
			// neighbour committing, then change one CIDR.
			eventually(t, "two resyncs with the neighbour committing", func() bool {
				return strings.Count(d.output()[mark:], "resync: the table read back is the wanted one") >= 2
			})
			if c.nft {
				eventually(t, "two nft batches beside the agent's table", func() bool { return neighbour.Commits() >= 2 })
			}
			cm.update("resyncInterval: 2s\n" + manyCIDRs(n, "203.0.113.0/24"))
			// The agent logs the change after it has read it back from the
			// kernel. (nft itself cannot list a large set while another
			// process commits 20 times a second: every commit interrupts
			// its dump, NLM_F_DUMP_INTR, and it starts again; so nft checks
			// once the neighbour has stopped.)
			eventually(t, "the change applied and read back", func() bool {
				return strings.Contains(d.output()[mark:], "applied new config")
			})
			eventually(t, "another resync after the change", func() bool {
				after := d.output()[mark:]
				i := strings.Index(after, "applied new config")
				return i >= 0 && strings.Contains(after[i:], "resync: the table read back is the wanted one")
			})
			commits, err := neighbour.Stop()
			probed, bad := p.Stop()
			if out, err := topo.NFT("list", "set", "inet", "ip-masq-agent", "nonmasq-v4"); err != nil || !strings.Contains(out, "203.0.113.0/24") {
				t.Errorf("the new CIDR is not in the kernel's set (%v)", err)
			}
			// nft reads the agent's sets before each of its batches: at
			// 100,000 CIDRs a batch takes half a second on a quiet node,
			// seconds on a loaded one.
			if busy := map[bool]int{false: 10, true: 2}[c.nft]; err != nil || commits < busy {
				t.Errorf("the neighbour made %d commits (%v): not busy", commits, err)
			}
			logs := d.output()
			for _, s := range []string{"sync failed", "repair failed", "level=ERROR"} {
				if c := strings.Count(logs, s); c > 0 {
					t.Errorf("%d lines with %q", c, s)
				}
			}
			if len(bad) > 0 || probed == 0 {
				t.Errorf("%d of %d probe answers were not 200, the first: %q", len(bad), probed, bad[:min(len(bad), 3)])
			}
			t.Logf("%d CIDRs, %d neighbour commits, %d probe answers", n, commits, probed)
		})
	}
}

// TestWaitingAgentHealth: a second agent while another owns the table is
// alive (/healthz 200: a restart would find the same owner) and not ready
// (/readyz 503, saying why), and it takes over when the owner exits.
//
// Where no agent owns the table (a kernel before 6.9, which the first
// agent says in its log, or --own-table=false: the subtest "not owned",
// which runs the same assertions on any kernel), no agent waits: the
// second never logs that it waits and is alive and ready while the first
// runs. (Both with the same config here: two agents with different
// configs rewrite each other's table, TestTwoDaemons.)
func TestWaitingAgentHealth(t *testing.T) {
	cfgA := "resyncInterval: 1h\nnonMasqueradeCIDRs: [203.0.113.0/24]\n"
	cfgB := "resyncInterval: 1h\nnonMasqueradeCIDRs: [10.0.0.0/8]\n"
	a, b := map[string]bool{internet1: false, private1: true}, map[string]bool{internet1: true, private1: false}
	noWait := func(t *testing.T, topo *testnet.Topology, first *daemon, flags ...string) {
		second := startDaemon(t, topo, append([]string{"--config", writeConfig(t, cfgA), "--http-address=127.0.0.1:9753"}, flags...)...)
		eventually(t, "the second agent ready", func() bool { code, _ := httpGet(topo, "/readyz"); return code == 200 })
		// The first agent's table is the config's: the second takes it
		// over as it is.
		eventually(t, "the second agent's first sync logged", func() bool {
			return strings.Contains(second.output(), "the kernel holds the config's table already")
		})
		if code, body := httpGet(topo, "/healthz"); code != 200 {
			t.Errorf("the second agent's /healthz: %d %q, want 200", code, body)
		}
		for _, s := range []string{"waiting for it to exit", "is owned by another process", "level=ERROR"} {
			if strings.Contains(second.output(), s) {
				t.Errorf("no agent owns the table, yet the second agent logged %q:\n%s", s, second.output())
			}
		}
		expectSources(t, topo, a)
		first.stop(t)
		if code, body := httpGet(topo, "/readyz"); code != 200 {
			t.Errorf("the second agent's /readyz after the first exited: %d %q, want 200", code, body)
		}
		expectSources(t, topo, a)
	}
	t.Run("owned", func(t *testing.T) {
		topo := newTopology(t)
		addDestinations(t, topo, internet1, private1)
		first := startDaemon(t, topo, "--config", writeConfig(t, cfgA), "--http-address=127.0.0.1:0")
		eventually(t, "config A", sourcesAre(topo, a))
		eventually(t, "the first apply logged", func() bool { return strings.Contains(first.output(), "applied config") })
		if !ownsTable(t, topo, first) {
			// Before Linux 6.9 (the probe at start found the kernel
			// refusing the owned table): no agent waits.
			noWait(t, topo, first)
			return
		}
		second := startDaemon(t, topo, "--config", writeConfig(t, cfgB), "--http-address=127.0.0.1:9753")
		eventually(t, "the second agent to wait", func() bool { return strings.Contains(second.output(), "waiting for it to exit") })
		// Several looks at the owner (one a second) later, still so.
		mark := strings.Count(second.output(), "is owned by another process; looking again")
		eventually(t, "three more looks at the owner", func() bool {
			return strings.Count(second.output(), "is owned by another process; looking again") >= mark+3
		})
		if code, body := httpGet(topo, "/healthz"); code != 200 {
			t.Errorf("the waiting agent's /healthz: %d %q, want 200 (alive)", code, body)
		}
		if code, body := httpGet(topo, "/readyz"); code != 503 || !strings.Contains(body, "another process owns table inet ip-masq-agent") {
			t.Errorf("the waiting agent's /readyz: %d %q, want 503 naming the owner", code, body)
		}
		first.stop(t)
		eventually(t, "config B after the first agent exited", sourcesAre(topo, b))
		eventually(t, "the second agent ready", func() bool { code, _ := httpGet(topo, "/readyz"); return code == 200 })
	})
	t.Run("not owned", func(t *testing.T) {
		topo := newTopology(t)
		addDestinations(t, topo, internet1, private1)
		first := startDaemon(t, topo, "--config", writeConfig(t, cfgA), "--http-address=127.0.0.1:0", "--own-table=false")
		eventually(t, "config A", sourcesAre(topo, a))
		noWait(t, topo, first, "--own-table=false")
	})
}

package test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft/kernel"
)

// TestOwnership: the agent's socket owns the table; the kernel refuses
// every other writer (nft included); after the agent closes its socket the
// table stays in force, and the next agent adopts it without rewriting it.
func TestOwnership(t *testing.T) {
	topo := newTopology(t)
	ns := int(topo.NodeHandle())
	owns := kernelOwns(t, topo)
	a := &kernel.Netlink{NetNS: ns} // not probed: its first create asks
	want := build(t, manyCIDRs(100, "10.0.0.0/8"))
	res, err := nft.Ensure(a, want)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Created {
		t.Fatalf("first apply: %+v, want created", res)
	}
	if !owns {
		// The kernel refused the owned create: the same Apply made the
		// table without ownership, and the Netlink no longer asks.
		found, _, err := a.Read()
		if err != nil || found == nil || found.Owner != nft.NotOwned || found.Persist || a.Owns() {
			t.Fatalf("read back: %+v, err %v, Owns %v; want a table not owned", found, err, a.Owns())
		}
		if out, err := topo.NFT("flush", "set", "inet", nft.TableName, nft.SetNonMasqV4); err != nil {
			t.Fatalf("nft flush set on a table not owned: %v %s", err, out)
		}
		if res, err := nft.Ensure(a, want); err != nil || !res.Partial {
			t.Fatalf("repair: %+v, %v; want changed in place", res, err)
		}
		a.Close()
		return
	}
	found, _, err := a.Read()
	if err != nil || found == nil || found.Owner != nft.OwnedByUs {
		t.Fatalf("read back: owner %v, err %v; want owned by us", found.Owner, err)
	}
	if out, err := topo.NFT("flush", "set", "inet", nft.TableName, nft.SetNonMasqV4); err == nil {
		t.Fatalf("nft flush set on an owned table succeeded: %s", out)
	}
	other := &kernel.Netlink{NetNS: ns}
	defer other.Close()
	if _, err := nft.Ensure(other, want); !errors.Is(err, nft.ErrOwnedByOther) {
		t.Fatalf("a second agent's apply: %v, want ErrOwnedByOther", err)
	}
	if err := other.Delete(); !errors.Is(err, nft.ErrOwnedByOther) {
		t.Fatalf("a second agent's delete: %v, want ErrOwnedByOther", err)
	}
	a.Close()
	listed, err := topo.NFT("list", "table", "inet", nft.TableName)
	if err != nil || !strings.Contains(listed, "10.0.0.0/8") {
		t.Fatalf("after the owner exited the table is gone: %v\n%s", err, listed)
	}
	res, err = nft.Ensure(other, want)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Plan.Ops) != 1 || res.Plan.Ops[0].Kind != nft.KindTable {
		t.Fatalf("adoption sent %q, want only the table's flags", res.Plan)
	}
	if err := other.Delete(); err != nil {
		t.Fatal(err)
	}
	if out, err := topo.NFT("list", "table", "inet", nft.TableName); err == nil {
		t.Fatalf("table still there after delete:\n%s", out)
	}
}

// pid1 runs a command as PID 1 of a new PID namespace, as the agent runs in
// its container: its netlink sockets autobind to port id 1, like any other
// PID 1 on the host network.
var pid1 = []string{"unshare", "--pid", "--fork", "--mount-proc", "--kill-child=SIGTERM"}

// TestForeignWriterAsPID1: another process with the same netlink port id
// as the daemon (both PID 1) writes another config. Owned, the kernel
// refuses it; not owned, the daemon reads the table back, undoes it, and a
// later config change is applied whole (the kernel holds exactly it).
func TestForeignWriterAsPID1(t *testing.T) {
	cfgA := "resyncInterval: 1h\nnonMasqueradeCIDRs: [203.0.113.0/24]\n"
	cfgB := "resyncInterval: 1h\nnonMasqueradeCIDRs: [10.0.0.0/8]\n"
	cfgC := "resyncInterval: 1h\nnonMasqueradeCIDRs: [10.0.0.0/8, 203.0.113.0/24]\nmasqueradeCIDRs: [10.250.0.11/32]\n"
	for _, owned := range []bool{true, false} {
		t.Run(fmt.Sprintf("owned=%v", owned), func(t *testing.T) {
			testnet.Require(t, "unshare")
			topo := newTopology(t)
			addDestinations(t, topo, internet1, private1)
			flag := fmt.Sprintf("--own-table=%v", owned)
			owned := owned && kernelOwns(t, topo) // else: the fallback, as not owned
			cm := newConfigMapDir(t, cfgA)
			d := startDaemonIn(t, topo, pid1, "--config", cm.path(), "--http-address=127.0.0.1:0", flag)
			a := map[string]bool{internet1: false, private1: true}
			eventually(t, "config A", sourcesAre(topo, a))

			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			out, err := topo.RunInNode(ctx, "unshare", append(pid1[1:], agentBin, "--once", "--config", writeConfig(t, cfgB), flag)...)
			if owned {
				if err == nil || !strings.Contains(string(out), "owned by another process") {
					t.Fatalf("a second writer changed an owned table: %v\n%s", err, out)
				}
				expectSources(t, topo, a)
			} else {
				// The daemon undoes B, perhaps before --once has read its
				// commit back: then --once, undone at each try, gives up
				// naming the rival. Either way the daemon put A back.
				if err != nil && !strings.Contains(string(out), "another process changed it back") {
					t.Fatalf("--once: %v\n%s", err, out)
				}
				eventually(t, "the daemon's repair", func() bool { return strings.Contains(d.output(), repairLine) })
				eventually(t, "config B undone", sourcesAre(topo, a))
			}
			cm.update(cfgC)
			eventually(t, "config C", sourcesAre(topo, map[string]bool{internet1: false, private1: false}))
			if code, out, stderr := runTool(t, topo, "diff", "--config", writeConfig(t, cfgC)); code != 0 {
				t.Errorf("the kernel does not hold exactly config C: exit %d\n%s%s", code, out, stderr)
			}
		})
	}
}

// TestTamperedShapesRepaired: objects of the agent's names re-made in
// another shape, and objects it never makes, are all removed or replaced,
// in one Ensure, with the agent's log saying so.
func TestTamperedShapesRepaired(t *testing.T) {
	for _, tc := range []struct{ name, tamper string }{
		{"a map under the set's name", "flush chain inet ip-masq-agent IP-MASQ-AGENT\ndelete set inet ip-masq-agent nonmasq-v4\n" +
			"add map inet ip-masq-agent nonmasq-v4 { type ipv4_addr : verdict; }\n"},
		{"the decision chain re-made as a base chain", "flush chain inet ip-masq-agent postrouting\ndelete chain inet ip-masq-agent IP-MASQ-AGENT\n" +
			"add chain inet ip-masq-agent IP-MASQ-AGENT { type nat hook postrouting priority 200; policy accept; }\n"},
		{"a set with a counter expression", "flush chain inet ip-masq-agent IP-MASQ-AGENT\ndelete set inet ip-masq-agent nonmasq-v4\n" +
			"add set inet ip-masq-agent nonmasq-v4 { type ipv4_addr; flags interval; counter; }\n"},
		{"a named counter and a quota", "add counter inet ip-masq-agent foreign\nadd quota inet ip-masq-agent q { over 1 mbytes }\n" +
			"insert rule inet ip-masq-agent IP-MASQ-AGENT counter name foreign\n"},
		{"a foreign chain and set", "add set inet ip-masq-agent extra { type ipv4_addr; }\nadd chain inet ip-masq-agent extra\n" +
			"insert rule inet ip-masq-agent IP-MASQ-AGENT ip daddr @extra jump extra\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			topo, d, want := notOwnedDaemon(t, "resyncInterval: 1h\n")
			if out, err := topo.NFT("-f", writeConfig(t, tc.tamper)); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			eventually(t, "the repair", func() bool {
				out, err := topo.NFT("list", "table", "inet", nft.TableName)
				return err == nil && withoutCounters(out) == want
			})
			expectSources(t, topo, map[string]bool{internet1: true, private1: false})
			// The log line follows the commit.
			eventually(t, "the repair's log line", func() bool { return strings.Contains(d.output(), repairLine) })
		})
	}
}

// TestTwoDaemons: two agents in one namespace with different configs.
// Owned: the second waits, changes nothing, and takes over when the first
// exits. Not owned: they notice each other and back off instead of
// rewriting the table in a loop.
func TestTwoDaemons(t *testing.T) {
	cfgA := "resyncInterval: 1h\nnonMasqueradeCIDRs: [203.0.113.0/24]\n"
	cfgB := "resyncInterval: 1h\nnonMasqueradeCIDRs: [10.0.0.0/8]\n"
	a, b := map[string]bool{internet1: false, private1: true}, map[string]bool{internet1: true, private1: false}
	notOwned := func(t *testing.T, topo *testnet.Topology, flags ...string) {
		first := startDaemon(t, topo, append([]string{"--config", writeConfig(t, cfgA), "--http-address=127.0.0.1:0"}, flags...)...)
		eventually(t, "config A", sourcesAre(topo, a))
		second := startDaemon(t, topo, append([]string{"--config", writeConfig(t, cfgB), "--http-address=127.0.0.1:0"}, flags...)...)
		eventually(t, "a rival to be reported", func() bool {
			return strings.Contains(first.output()+second.output(), "another process keeps rewriting")
		})
		// Backing off from 1 s, doubling: each agent's next rewrites are
		// at least a second apart in its own log (a loop without back-off:
		// about 40 a second each).
		count := func() int {
			return strings.Count(first.output(), repairLine) + strings.Count(second.output(), repairLine)
		}
		mark := count()
		eventually(t, "four more rewrites", func() bool { return count() >= mark+4 })
		for i, d := range []*daemon{first, second} {
			out := d.output()
			rival := strings.Index(out, "another process keeps rewriting")
			if rival < 0 {
				continue
			}
			rival = strings.LastIndex(out[:rival], "\n") + 1 // the line's start
			// From the report (logged right after the rewrite that made it).
			at := append(logTimes(t, out[rival:], "another process keeps rewriting")[:1], logTimes(t, out[rival:], repairLine)...)
			for j := 1; j < len(at); j++ {
				if gap := at[j].Sub(at[j-1]); gap < 500*time.Millisecond { // a second, less a late log line
					t.Errorf("agent %d: rewrites %s apart after it reported the rival: still fighting", i+1, gap)
				}
			}
			t.Logf("agent %d: rewrites after it reported the rival: %s apart", i+1, gaps(at))
		}
	}
	t.Run("owned", func(t *testing.T) {
		topo := newTopology(t)
		addDestinations(t, topo, internet1, private1)
		if !kernelOwns(t, topo) {
			notOwned(t, topo) // the default flags fall back to verify and repair
			return
		}
		first := startDaemon(t, topo, "--config", writeConfig(t, cfgA), "--http-address=127.0.0.1:0")
		eventually(t, "config A", sourcesAre(topo, a))
		second := startDaemon(t, topo, "--config", writeConfig(t, cfgB), "--http-address=127.0.0.1:0")
		eventually(t, "the second agent to wait", func() bool { return strings.Contains(second.output(), "waiting for it to exit") })
		// Two more looks at the owned table, each refused: config A stays.
		const look = "is owned by another process; looking again"
		looks := strings.Count(second.output(), look)
		eventually(t, "two more looks by the second agent", func() bool { return strings.Count(second.output(), look) >= looks+2 })
		expectSources(t, topo, a)
		first.stop(t)
		eventually(t, "config B after the first agent exited", sourcesAre(topo, b))
	})
	t.Run("not owned", func(t *testing.T) {
		topo := newTopology(t)
		addDestinations(t, topo, internet1, private1)
		notOwned(t, topo, "--own-table=false")
	})
}

// TestStalePlanRefused: a plan made from a read is refused by the kernel
// when it no longer fits, e.g. a table created between the read and the
// write; Ensure then reads again and converges, removing what it did not
// make.
func TestStalePlanRefused(t *testing.T) {
	topo := newTopology(t)
	k := &kernel.Netlink{NetNS: int(topo.NodeHandle()), NoOwner: true}
	defer k.Close()
	want := build(t, "")
	found, gen, err := k.Read()
	if err != nil || found != nil {
		t.Fatalf("read: %v %v", found, err)
	}
	if out, err := topo.NFT("-f", writeConfig(t, "table inet ip-masq-agent {\n chain foreign { type nat hook postrouting priority 0; }\n}\n")); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	p, err := nft.PlanFor(found, want)
	if err != nil {
		t.Fatal(err)
	}
	// Made for no table, the plan creates it exclusively: the kernel
	// refuses it over the table that appeared, and the plan is stale (no
	// generation guard: on a busy node, other tables' commits would refuse
	// every plan).
	if _, err := k.Send(p, gen); !errors.Is(err, syscall.EEXIST) || !errors.Is(err, nft.ErrStale) {
		t.Fatalf("a plan for a table that was not there: %v, want EEXIST and ErrStale", err)
	}
	res, err := nft.Ensure(k, want)
	if err != nil {
		t.Fatal(err)
	}
	if listed := listTable(t, topo); strings.Contains(listed, "foreign") || res.Found == nil {
		t.Errorf("after Ensure (%+v):\n%s", res, listed)
	}
}

// TestRandomPlansKernel: a seeded walk through random configs, with random
// foreign changes made with nft in between (the table not owned): every
// Ensure's plan, applied by the kernel, yields exactly the wanted table, as
// the agent reads it back and as nft lists it.
func TestRandomPlansKernel(t *testing.T) {
	topo := newTopology(t)
	k := &kernel.Netlink{NetNS: int(topo.NodeHandle()), NoOwner: true}
	defer k.Close()
	rng := rand.New(rand.NewPCG(7, 11))
	prefix := func() string {
		bits := 8 + rng.IntN(25)
		a := netip.AddrFrom4([4]byte{byte(1 + rng.IntN(223)), byte(rng.IntN(256)), byte(rng.IntN(256)), byte(rng.IntN(256))})
		p, _ := a.Prefix(bits)
		return p.String()
	}
	prefix6 := func() string {
		var b [16]byte
		b[0], b[1], b[2], b[3] = 0x20, 0x01, 0x0d, 0xb8
		b[4], b[5] = byte(rng.IntN(256)), byte(rng.IntN(256))
		p, _ := netip.AddrFrom16(b).Prefix(32 + rng.IntN(33))
		return p.String()
	}
	list := func(n int, gen func() string) string {
		var l []string
		for range n {
			l = append(l, `"`+gen()+`"`)
		}
		return "[" + strings.Join(l, ", ") + "]"
	}
	tampers := []string{
		"add element inet ip-masq-agent nonmasq-v4 { 198.51.100.0/24 }",
		"flush set inet ip-masq-agent nonmasq-v4",
		"flush chain inet ip-masq-agent IP-MASQ-AGENT",
		"add element inet ip-masq-agent masq-v4 { 192.0.2.10-192.0.2.13 }",
		"insert rule inet ip-masq-agent IP-MASQ-AGENT ip daddr 192.0.2.99 return",
		"add chain inet ip-masq-agent stray",
		"add counter inet ip-masq-agent stray",
		"delete table inet ip-masq-agent",
	}
	steps := pick(60, 400)
	for i := range steps {
		cfg := fmt.Sprintf("nonMasqueradeCIDRs: %s\nmasqueradeCIDRs: %s\nmasqLinkLocal: %v\nmasqOutBound: %v\n",
			list(rng.IntN(40), prefix), list(rng.IntN(5), prefix), rng.IntN(2) == 0, rng.IntN(2) == 0)
		ipv6 := rng.IntN(2) == 0
		if ipv6 {
			cfg = strings.Replace(cfg, "nonMasqueradeCIDRs: [", "nonMasqueradeCIDRs: ["+strings.Trim(list(1+rng.IntN(5), prefix6), "[]")+", ", 1)
		}
		c, _, err := config.Parse([]byte(cfg), config.Flags{EnableIPv6: ipv6})
		if err != nil {
			t.Fatalf("step %d: config %q: %v", i, cfg, err)
		}
		want := nft.Build(c, nft.Options{Chain: nft.DefaultChain, EnableIPv6: ipv6, RandomFully: rng.IntN(2) == 0})
		if i > 0 && rng.IntN(3) == 0 {
			tamper := tampers[rng.IntN(len(tampers))]
			if out, err := topo.NFT("-f", writeConfig(t, tamper+"\n")); err != nil {
				t.Logf("step %d: tamper %q refused: %v %s", i, tamper, err, out)
			}
		}
		res, err := nft.Ensure(k, want)
		if err != nil {
			t.Fatalf("step %d: apply: %v\nconfig:\n%s", i, err, cfg)
		}
		if res.Recreated {
			t.Errorf("step %d: re-created the table (%s); in place was expected", i, res.Plan.Why)
		}
		got, _, err := k.Read()
		if err != nil || got == nil || !want.Equal(*got) {
			t.Fatalf("step %d: read back differs (%v):\n%s", i, err, nft.DiffPlan(got, want))
		}
		if i%10 == 0 {
			// nft as the independent reader: the wanted table, loaded by
			// nft -f elsewhere, lists the same.
			file := writeConfig(t, "table inet ip-masq-agent\ndelete table inet ip-masq-agent\n"+nft.Render(want))
			if out, err := testnet.Exec(topo.ExtNS, "nft", "-f", file); err != nil {
				t.Fatalf("nft -f: %v\n%s", err, out)
			}
			loaded, err := testnet.Exec(topo.ExtNS, "nft", "list", "table", "inet", nft.TableName)
			if err != nil {
				t.Fatal(err)
			}
			if listed, want := withoutCounters(listTable(t, topo)), withoutCounters(string(loaded)); listed != want {
				t.Fatalf("step %d: nft lists:\n%s\nwant:\n%s", i, listed, want)
			}
		}
	}
	t.Logf("%d random plans applied and verified", steps)
}

// TestResyncNotStarvedByRepairs: another process touches the table more
// often than the resync interval, and the config file changes without a
// file event (written through a hard link in another directory, which
// inotify on the config's directory does not see). Repairs do not postpone
// the resync: the change is applied at the resync deadline.
func TestResyncNotStarvedByRepairs(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, internet1, private1)
	dir, other := t.TempDir(), t.TempDir()
	path := dir + "/ip-masq-agent"
	if err := os.WriteFile(path, []byte("resyncInterval: 3s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := other + "/same-file"
	if err := os.Link(path, link); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, topo, "--config", path, "--http-address=127.0.0.1:0", "--own-table=false")
	eventually(t, "the rules", sourcesAre(topo, map[string]bool{internet1: true, private1: false}))

	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // a foreign touch every second, for at most 30 s
		defer close(done)
		for i := 0; i < 30; i++ {
			select {
			case <-stop:
				return
			case <-time.After(time.Second):
			}
			topo.NFT("add", "element", "inet", nft.TableName, "nonmasq-v4", "{ 198.51.100.0/24 }")
		}
	}()
	defer func() { close(stop); <-done }()
	eventually(t, "a foreign touch repaired", func() bool { return strings.Contains(d.output(), repairLine) })
	f, err := os.OpenFile(link, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("resyncInterval: 3s\nnonMasqueradeCIDRs: [203.0.113.0/24]\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	eventually(t, "the change, at a resync", sourcesAre(topo, map[string]bool{internet1: false, private1: true}))
	if strings.Contains(d.output(), "config file changed") {
		t.Fatalf("the change was seen as a file event; the test needs it unseen:\n%s", d.output())
	}
	// The toucher went on throughout (a slow kernel guest may have had
	// one touch only before the resync): its touches are repaired too.
	eventually(t, "the foreign touches repaired meanwhile", func() bool { return strings.Count(d.output(), repairLine) >= 2 })
}

// TestHiddenRuleChangeRepaired: a masquerade expression with flags that
// nft does not show (NF_NAT_RANGE_PROTO_SPECIFIED without port registers:
// every flow squeezed onto source port 0) lists exactly like the agent's
// rule, and google/nftables' decoder drops those flags too: the agent
// compares the kernel's encoding with its own and puts the rule back.
func TestHiddenRuleChangeRepaired(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, internet1)
	cm := newConfigMapDir(t, "resyncInterval: 1h\n")
	d := startDaemon(t, topo, "--config", cm.path(), "--http-address=127.0.0.1:0", "--own-table=false")
	eventually(t, "the rules", sourcesAre(topo, map[string]bool{internet1: true}))
	waitStarted(t, d) // the change below comes after the first apply's read-back
	before := listTable(t, topo)
	out, err := topo.NFT("-a", "list", "chain", "inet", nft.TableName, nft.MasqChainName)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`masquerade.*# handle (\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no masquerade rule in:\n%s", out)
	}
	handle, _ := strconv.ParseUint(m[1], 10, 64)
	replaceMasqRule(t, topo, handle, 0x12) // RANDOM_FULLY | PROTO_SPECIFIED
	eventually(t, "the repair of the hidden change", func() bool { return strings.Contains(d.output(), repairLine) })
	if after := listTable(t, topo); withoutCounters(after) != withoutCounters(before) {
		t.Errorf("after the repair:\n%s\nwant:\n%s", after, before)
	}
	ap, err := topo.SourcePortSeen("udp", netip.MustParseAddr(internet1))
	if err != nil || ap.Addr() != topo.NodeUplink4 || ap.Port() == 0 {
		t.Errorf("a UDP flow after the repair arrives from %s (%v), want the node's address and a real port", ap, err)
	}
}

// replaceMasqRule replaces rule handle of masq-to-node with counter +
// masq{flags}, the agent's comment kept, over raw netlink (nft cannot
// write it).
func replaceMasqRule(t *testing.T, topo *testnet.Topology, handle uint64, flags uint32) {
	t.Helper()
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: int(topo.NodeHandle())})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	marshal := func(as ...netlink.Attribute) []byte {
		b, err := netlink.MarshalAttributes(as)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	expr := func(name string, data ...netlink.Attribute) netlink.Attribute {
		return netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_LIST_ELEM, Data: marshal(
			netlink.Attribute{Type: unix.NFTA_EXPR_NAME, Data: []byte(name + "\x00")},
			netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_EXPR_DATA, Data: marshal(data...)})}
	}
	comment := "ip-masq-agent: masquerade to the node's address"
	rule := marshal(
		netlink.Attribute{Type: unix.NFTA_RULE_TABLE, Data: []byte(nft.TableName + "\x00")},
		netlink.Attribute{Type: unix.NFTA_RULE_CHAIN, Data: []byte(nft.MasqChainName + "\x00")},
		netlink.Attribute{Type: unix.NFTA_RULE_HANDLE, Data: binary.BigEndian.AppendUint64(nil, handle)},
		netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_RULE_EXPRESSIONS, Data: marshal(
			expr("counter", netlink.Attribute{Type: unix.NFTA_COUNTER_BYTES, Data: make([]byte, 8)},
				netlink.Attribute{Type: unix.NFTA_COUNTER_PACKETS, Data: make([]byte, 8)}),
			expr("masq", netlink.Attribute{Type: unix.NFTA_MASQ_FLAGS, Data: binary.BigEndian.AppendUint32(nil, flags)}))},
		netlink.Attribute{Type: unix.NFTA_RULE_USERDATA, Data: append([]byte{0, byte(len(comment) + 1)}, comment+"\x00"...)},
	)
	hdr := func(family uint8, resID uint16) []byte {
		return binary.BigEndian.AppendUint16([]byte{family, unix.NFNETLINK_V0}, resID)
	}
	msgs := []netlink.Message{
		{Header: netlink.Header{Type: unix.NFNL_MSG_BATCH_BEGIN, Flags: netlink.Request, Sequence: 1}, Data: hdr(unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES)},
		{Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWRULE), Flags: netlink.Request | netlink.Replace | netlink.Acknowledge, Sequence: 2},
			Data: append(hdr(unix.NFPROTO_INET, 0), rule...)},
		{Header: netlink.Header{Type: unix.NFNL_MSG_BATCH_END, Flags: netlink.Request, Sequence: 3}, Data: hdr(unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES)},
	}
	if _, err := conn.SendMessages(msgs); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Receive(); err != nil {
		t.Fatalf("replace the masquerade rule: %v", err)
	}
}

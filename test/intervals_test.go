package test

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"go4.org/netipx"

	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft/kernel"
)

// deleteIntervalEnd removes one element of an interval set the way a
// foreign process can: a raw DELSETELEM of the end of one interval, which
// the kernel accepts and which leaves a start without its end.
func deleteIntervalEnd(topo *testnet.Topology, set string, end netip.Addr, isEnd bool) error {
	c, err := nftables.New(nftables.WithNetNSFd(int(topo.NodeHandle())))
	if err != nil {
		return err
	}
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: nft.TableName}
	key := nftables.TypeIPAddr
	if end.Is6() {
		key = nftables.TypeIP6Addr
	}
	s := &nftables.Set{Table: t, Name: set, KeyType: key, Interval: true, KeyByteOrder: binaryutil.BigEndian}
	if err := c.SetDeleteElements(s, []nftables.SetElement{{Key: end.AsSlice(), IntervalEnd: isEnd}}); err != nil {
		return err
	}
	return c.Flush()
}

// TestLoneIntervalStart: a foreign process deletes only the end of one
// interval (20.0.0.1/32's). The kernel's lookup then matches from that
// start up to the next element, here 203.0.113.0: new flows to the
// internet leave with the pod's address. Not owned, the agent must see
// that (the set is not what it wrote) and repair it; owned, the kernel
// refuses the deletion.
func TestLoneIntervalStart(t *testing.T) {
	const cfg = "resyncInterval: 1h\nmasqLinkLocal: true\nnonMasqueradeCIDRs: [10.0.0.0/8, 20.0.0.1/32, 203.0.113.0/24]\n"
	t.Run("not owned: repaired", func(t *testing.T) {
		topo := newTopology(t)
		addDestinations(t, topo, internet2)
		d := startDaemon(t, topo, "--config", writeConfig(t, cfg), "--http-address=127.0.0.1:0", "--own-table=false")
		eventually(t, "the table", sourcesAre(topo, map[string]bool{internet2: true}))
		// The first sync reads its commit back: wait for its end, or it
		// repairs the change itself, as part of the first apply.
		eventually(t, "the first apply logged", func() bool { return strings.Contains(d.output(), "applied config") })
		mark := len(d.output())
		if err := deleteIntervalEnd(topo, nft.SetNonMasqV4, netip.MustParseAddr("20.0.0.2"), true); err != nil {
			t.Fatalf("the kernel refused the foreign deletion of an interval end: %v", err)
		}
		eventually(t, "the repair", func() bool { return strings.Contains(d.output()[mark:], "put it back") })
		listed := listTable(t, topo)
		if !strings.Contains(strings.Join(strings.Fields(listed), " "), "elements = { 10.0.0.0/8, 20.0.0.1, 203.0.113.0/24 }") {
			t.Errorf("after the repair:\n%s", listed)
		}
		expectSources(t, topo, map[string]bool{internet2: true})
	})
	t.Run("owned: refused", func(t *testing.T) { // (or, on a kernel that cannot own, repaired)
		topo := newTopology(t)
		addDestinations(t, topo, internet2)
		d := startDaemon(t, topo, "--config", writeConfig(t, cfg), "--http-address=127.0.0.1:0")
		eventually(t, "the table", sourcesAre(topo, map[string]bool{internet2: true}))
		eventually(t, "the first apply logged", func() bool { return strings.Contains(d.output(), "applied config") })
		owned := strings.Contains(listTable(t, topo), "flags owner")
		mark := len(d.output())
		err := deleteIntervalEnd(topo, nft.SetNonMasqV4, netip.MustParseAddr("20.0.0.2"), true)
		switch {
		case owned && err == nil:
			t.Fatal("the kernel took a foreign change to an owned table")
		case !owned:
			// Before Linux 6.9 the default falls back to verify and
			// repair: the change is taken and undone.
			if err != nil {
				t.Fatalf("the kernel refused a foreign change to a table it cannot own: %v", err)
			}
			eventually(t, "the repair (the fallback)", func() bool { return strings.Contains(d.output()[mark:], repairLine) })
		}
		if listed := listTable(t, topo); !strings.Contains(strings.Join(strings.Fields(listed), " "), "elements = { 10.0.0.0/8, 20.0.0.1, 203.0.113.0/24 }") {
			t.Errorf("after the refused change:\n%s", listed)
		}
		expectSources(t, topo, map[string]bool{internet2: true})
	})
}

var nftElementsRE = regexp.MustCompile(`(?s)elements = \{([^}]*)\}`)

// nftRanges parses the elements nft lists for a set as address ranges.
func nftRanges(t *testing.T, listed string) []netipx.IPRange {
	t.Helper()
	m := nftElementsRE.FindStringSubmatch(listed)
	if m == nil {
		return nil
	}
	var b netipx.IPSetBuilder
	for _, e := range strings.Split(m[1], ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		if from, to, ok := strings.Cut(e, "-"); ok {
			b.AddRange(netipx.IPRangeFrom(netip.MustParseAddr(from), netip.MustParseAddr(to)))
		} else if p, err := netip.ParsePrefix(e); err == nil {
			b.AddPrefix(p)
		} else {
			b.Add(netip.MustParseAddr(e))
		}
	}
	s, err := b.IPSet()
	if err != nil {
		t.Fatal(err)
	}
	return s.Ranges()
}

// ipRanges is rs as netipx has them, as they are.
func ipRanges(rs []nft.Range) []netipx.IPRange {
	out := make([]netipx.IPRange, len(rs))
	for i, r := range rs {
		out[i] = r.IPRange()
	}
	return out
}

func merged(rs []nft.Range) []netipx.IPRange {
	var b netipx.IPSetBuilder
	for _, r := range rs {
		b.AddRange(r.IPRange())
	}
	s, _ := b.IPSet()
	return s.Ranges()
}

// TestIntervalDecodeMatchesNft: random interval sets, then random raw
// deletions of single elements (an end, a start) that leave shapes the
// agent never writes. The agent's reader must say the addresses the
// kernel matches, as nft lists them, and call every such set odd (so that
// a repair replaces it).
func TestIntervalDecodeMatchesNft(t *testing.T) {
	topo := newTopology(t)
	k := &kernel.Netlink{NetNS: int(topo.NodeHandle()), NoOwner: true}
	defer k.Close()
	rng := rand.New(rand.NewPCG(26, 3))
	rounds := 25
	if soakMode() {
		rounds = 300
	}
	for round := range rounds {
		v6 := round%3 == 2
		set, base := nft.SetNonMasqV4, netip.MustParseAddr("10.0.0.0")
		if v6 {
			set, base = nft.SetNonMasqV6, netip.MustParseAddr("fd00::")
		}
		// Random disjoint prefixes, some adjacent, one maybe at the top.
		var ps []netip.Prefix
		addr := base
		for range 1 + rng.IntN(8) {
			for range rng.IntN(4) {
				addr = netipx.PrefixLastIP(netip.PrefixFrom(addr, addr.BitLen()-8)).Next()
			}
			bits := addr.BitLen() - 8 + rng.IntN(9)
			p := netip.PrefixFrom(addr, bits).Masked()
			ps = append(ps, p)
			addr = netipx.PrefixLastIP(p).Next()
			if !addr.IsValid() {
				break
			}
		}
		lines := make([]string, len(ps))
		for i, p := range ps {
			lines[i] = "- " + p.String()
		}
		flags := []string{"--once", "--own-table=false", "--config", writeConfig(t, "masqLinkLocal: true\nmasqLinkLocalIPv6: true\nnonMasqueradeCIDRs:\n"+strings.Join(lines, "\n")+"\n")}
		if v6 {
			flags = append(flags, "--enable-ipv6")
		}
		if out, err := runAgent(t, topo, flags...); err != nil {
			t.Fatalf("round %d: %v\n%s", round, err, out)
		}
		// Delete one to three single elements: ends or starts.
		var did []string
		for range 1 + rng.IntN(3) {
			p := ps[rng.IntN(len(ps))]
			isEnd := rng.IntN(3) > 0
			a := p.Addr()
			if isEnd {
				a = netipx.PrefixLastIP(p).Next()
				if !a.IsValid() {
					continue
				}
			}
			if err := deleteIntervalEnd(topo, set, a, isEnd); err == nil {
				did = append(did, fmt.Sprintf("%s (end %v)", a, isEnd))
			}
		}
		found, err := k.ReadAll()
		if err != nil {
			t.Fatalf("round %d: read: %v", round, err)
		}
		s := found.Set(set)
		out, err := topo.NFT("list", "set", "inet", nft.TableName, set)
		if err != nil {
			t.Fatalf("round %d: %v\n%s", round, err, out)
		}
		want := nftRanges(t, out)
		if got := merged(s.Elements); !slices.Equal(got, want) {
			t.Errorf("round %d: prefixes %v, deleted %v:\nthe agent reads %v\nnft lists       %v\n%s", round, ps, did, got, want, out)
		}
		// The agent must not take it for the config's set: odd (replaced
		// whole), or other ranges than the config's (changed in place).
		if len(did) > 0 && s.Odd == "" && slices.Equal(ipRanges(s.Elements), rangesOf(ps)) {
			t.Errorf("round %d: deleted %v, the set reads as the config's", round, did)
		}
	}
}

// rangesOf is the config's set as the agent writes it: adjacent prefixes
// merged into the fewest ranges.
func rangesOf(ps []netip.Prefix) []netipx.IPRange {
	var b netipx.IPSetBuilder
	for _, p := range ps {
		b.AddPrefix(p)
	}
	s, _ := b.IPSet()
	return s.Ranges()
}

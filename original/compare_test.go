package original

import (
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"

	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
)

var (
	defaultList  = []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"}
	reservedList = []string{"100.64.0.0/10", "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24",
		"198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "240.0.0.0/4"}
)

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

// Compare against the original's rules as iptables-nft encodes them: each
// case is a pair of configurations, and the exact ranges that change.
func TestCompare(t *testing.T) {
	type want struct{ fam, rng, orig, agent, fix string }
	for _, tc := range []struct {
		name  string
		orig  Written
		flags config.Flags
		edit  func(*config.Config)
		kept  int // families kept
		want  []want
		more  int // further differences not listed in want
	}{
		{name: "the addon's --nomasq-all-reserved-ranges not carried over",
			orig: Written{Chain: AddonChain, NonMasq: append(append([]string{}, defaultList...), reservedList...)},
			want: []want{{"ipv4", "100.64.0.0/10", "not masqueraded", "masquerade", "--nomasq-all-reserved-ranges (the original ran with it)"},
				{"ipv4", "192.0.0.0/24", "not masqueraded", "masquerade", "--nomasq-all-reserved-ranges (the original ran with it)"}},
			more: 6},
		{name: "the addon's flag carried over", orig: Written{Chain: AddonChain, NonMasq: append(append([]string{}, defaultList...), reservedList...)},
			flags: config.Flags{NoMasqAllReservedRanges: true}},
		{name: "same config", orig: Written{NonMasq: defaultList}},
		{name: "the flag given here only", orig: Written{NonMasq: defaultList}, flags: config.Flags{NoMasqAllReservedRanges: true},
			want: []want{{"ipv4", "100.64.0.0/10", "masquerade", "not masqueraded", "no --nomasq-all-reserved-ranges (the original ran without it)"}}, more: 7},
		{name: "the flag, but a config of its own", orig: Written{NonMasq: defaultList},
			edit: func(c *config.Config) {
				c.NonMasqueradeCIDRs = prefixes("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10")
			},
			want: []want{{"ipv4", "100.64.0.0/10", "masquerade", "not masqueraded", "nonMasqueradeCIDRs: remove 100.64.0.0/10"}}},
		{name: "--enable-ipv6 not carried over: IPv6 kept", orig: Written{EnableIPv6: true, NonMasq: append([]string{"fd00::/8"}, defaultList...)}, kept: 1},
		{name: "--enable-ipv6 carried over", orig: Written{EnableIPv6: true, NonMasq: append([]string{"fd00::/8"}, defaultList...)},
			flags: config.Flags{EnableIPv6: true}, edit: func(c *config.Config) { c.NonMasqueradeCIDRs = append(c.NonMasqueradeCIDRs, prefixes("fd00::/8")...) }},
		{name: "--enable-ipv6 here only", orig: Written{NonMasq: defaultList}, flags: config.Flags{EnableIPv6: true},
			want: []want{{"ipv6", "::-fe7f:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "not masqueraded", "masquerade", "no --enable-ipv6 (the original ran without it and left IPv6 alone)"},
				{"ipv6", "fec0::-ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "not masqueraded", "masquerade", "no --enable-ipv6 (the original ran without it and left IPv6 alone)"}}},
		{name: "masqLinkLocal mismatch", orig: Written{MasqLinkLocal: true, NonMasq: defaultList},
			want: []want{{"ipv4", "169.254.0.0/16", "masquerade", "not masqueraded", "masqLinkLocal: true"}}},
		{name: "masqLinkLocalIPv6 mismatch", orig: Written{EnableIPv6: true, NonMasq: defaultList}, flags: config.Flags{EnableIPv6: true},
			edit: func(c *config.Config) { c.MasqLinkLocalIPv6 = true },
			want: []want{{"ipv6", "fe80::/10", "not masqueraded", "masquerade", "masqLinkLocalIPv6: false"}}},
		{name: "a CIDR missing", orig: Written{NonMasq: append([]string{"203.0.113.0/25", "203.0.113.128/25"}, defaultList...)},
			want: []want{{"ipv4", "203.0.113.0/24", "not masqueraded", "masquerade", "nonMasqueradeCIDRs: add 203.0.113.0/24"}}},
		{name: "masqueradeCIDRs", orig: Written{NonMasq: defaultList},
			edit: func(c *config.Config) { c.MasqueradeCIDRs = prefixes("10.1.0.0/16", "198.51.100.0/24") },
			want: []want{{"ipv4", "10.1.0.0/16", "not masqueraded", "masquerade", "masqueradeCIDRs: remove 10.1.0.0/16 (the original has no such key)"}}},
		{name: "masqOutBound false", orig: Written{NonMasq: defaultList}, edit: func(c *config.Config) { c.MasqOutBound = false },
			want: []want{{"ipv4", "0.0.0.0-9.255.255.255", "masquerade", "not masqueraded", "masqOutBound: true"}}, more: 4},
		// Traffic from sources that no source key singles out is compared:
		// a source key alone changes nothing here.
		{name: "nonMasqueradeSourceCIDRs", orig: Written{NonMasq: defaultList},
			edit: func(c *config.Config) { c.NonMasqueradeSourceCIDRs = prefixes("10.244.1.0/24") }},
		{name: "an octal /010 read as /8 by the original", orig: Written{NonMasq: []string{"10.0.0.0/8"}},
			edit: func(c *config.Config) { c.NonMasqueradeCIDRs = prefixes("10.0.0.0/10") },
			want: []want{{"ipv4", "10.64.0.0-10.255.255.255", "not masqueraded", "masquerade", "nonMasqueradeCIDRs: add 10.64.0.0/10, 10.128.0.0/9"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default(tc.flags)
			if tc.edit != nil {
				tc.edit(&cfg)
			}
			c := Compare(tc.orig.Rules(), cfg, tc.flags, nft.Options{EnableIPv6: tc.flags.EnableIPv6, Chain: nft.DefaultChain})
			if !c.Found || c.Inexact || len(c.Kept) != tc.kept {
				t.Errorf("found %v inexact %v kept %d", c.Found, c.Inexact, len(c.Kept))
			}
			if len(c.Differences) != len(tc.want)+tc.more {
				t.Errorf("%d differences, want %d:\n%s", len(c.Differences), len(tc.want)+tc.more, c.Key())
			}
			for i, w := range tc.want {
				if i >= len(c.Differences) {
					break
				}
				d := c.Differences[i]
				got := want{d.FamilyName(), d.RangeString(), d.Original.String(), d.Agent.String(), d.Fix}
				if got != w {
					t.Errorf("difference %d:\n got %+v\nwant %+v", i, got, w)
				}
				if d.OriginalWhy == "" || d.AgentWhy == "" {
					t.Errorf("difference %d without reasons: %+v", i, d)
				}
			}
		})
	}
}

// An exemption before the original's jump decided too; a chain that is
// not the original's is no switch; a rule whose bounds are unknown makes
// the comparison inexact.
func TestCompareExemptionsAndForeign(t *testing.T) {
	o := Written{NonMasq: defaultList}.Rules()
	accept := newXTRule(7, append(daddrPrefix(4, netip.MustParsePrefix("198.51.100.0/24")), &expr.Counter{}, &expr.Verdict{Kind: expr.VerdictAccept}), nil)
	o.Families[0].Exemptions = []XTRule{accept}
	cfg := config.Default(config.Flags{})
	c := Compare(o, cfg, config.Flags{}, nft.Options{})
	if len(c.Differences) != 1 || c.Differences[0].RangeString() != "198.51.100.0/24" || !strings.HasPrefix(c.Differences[0].Fix, "nonMasqueradeCIDRs: add 198.51.100.0/24 (a rule in nat POSTROUTING") {
		t.Errorf("exemption:\n%s", c.Key())
	}

	foreign := Rules{Families: []Family{{Family: 4, Chain: nft.DefaultChain, ChainPresent: true, Rules: []XTRule{{Text: "accept"}}}, absent(6, "")}}
	if c := Compare(foreign, cfg, config.Flags{}, nft.Options{}); c.Found || len(c.Differences) != 0 {
		t.Errorf("a foreign chain compared: %+v", c)
	}
	if c := Compare(Rules{}, cfg, config.Flags{}, nft.Options{}); c.Found {
		t.Error("nothing found, yet compared")
	}

	odd := Written{NonMasq: defaultList}.Rules()
	r := &odd.Families[0].Rules[1] // 10.0.0.0/8 loaded from its second byte on: no finite bounds
	r.exprs = []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 17, Len: 1}, &expr.Cmp{Register: 1, Data: []byte{0}}, &expr.Verdict{Kind: expr.VerdictReturn}}
	if c := Compare(odd, cfg, config.Flags{}, nft.Options{}); !c.Inexact {
		t.Error("a load from the middle of the address: not inexact")
	}
}

// The comparison is exact: at random addresses, each side's evaluator
// agrees with the ranges reported.
func TestCompareExact(t *testing.T) {
	o := Written{EnableIPv6: true, MasqLinkLocal: true, NonMasq: []string{"10.0.0.0/8", "100.64.0.0/10", "2001:db8::/33", "203.0.113.7/32"}}.Rules()
	flags := config.Flags{EnableIPv6: true}
	cfg := config.Default(flags)
	cfg.NonMasqueradeCIDRs = prefixes("10.0.0.0/9", "100.96.0.0/11", "2001:db8::/32", "203.0.113.0/24")
	cfg.MasqueradeCIDRs = prefixes("10.1.0.0/16")
	opts := nft.Options{EnableIPv6: true}
	c := Compare(o, cfg, flags, opts)
	want := nft.Build(cfg, opts)
	for _, s := range []string{"0.0.0.1", "10.0.0.1", "10.1.2.3", "10.200.0.1", "100.64.0.1", "100.100.0.1", "169.254.1.1", "203.0.113.7", "203.0.113.8",
		"255.255.255.255", "2001:db8::1", "2001:db8:8000::1", "fe80::1", "::1", "ffff::1"} {
		a := netip.MustParseAddr(s)
		e, decided := o.ExplainOriginal(a, false)
		m, _ := want.Decider()(nft.Packet{Dst: a})
		differs := (decided && e.Masquerade) != m
		reported := false
		for _, d := range c.Differences {
			reported = reported || d.Range.Contains(a)
		}
		if differs != reported {
			t.Errorf("%s: differs %v, reported %v\n%s", s, differs, reported, c.Key())
		}
	}
}

// Random pairs of configurations: at every bound of both sides, the
// address before it and random addresses, an address is in a reported
// range exactly when the two sides decide it differently; the ranges are
// sorted and apart.
func TestCompareRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 31))
	prefix := func(v6 bool) string {
		if v6 {
			b := make([]byte, 16)
			b[0], b[1], b[2], b[3], b[4] = 0x20, 0x01, 0x0d, 0xb8, byte(r.IntN(4))
			a, _ := netip.AddrFromSlice(b)
			return netip.PrefixFrom(a, 30+r.IntN(12)).Masked().String()
		}
		a := netip.AddrFrom4([4]byte{byte(r.IntN(4) * 64), byte(r.IntN(256)), 0, 0})
		return netip.PrefixFrom(a, 2+r.IntN(20)).Masked().String()
	}
	for i := range 120 {
		var w Written
		w.EnableIPv6, w.MasqLinkLocal, w.MasqLinkLocalIPv6 = r.IntN(2) == 0, r.IntN(3) == 0, r.IntN(3) == 0
		for range r.IntN(6) {
			w.NonMasq = append(w.NonMasq, prefix(r.IntN(3) == 0))
		}
		flags := config.Flags{EnableIPv6: r.IntN(2) == 0, NoMasqAllReservedRanges: r.IntN(2) == 0}
		cfg := config.Default(flags)
		if r.IntN(2) == 0 {
			cfg.NonMasqueradeCIDRs = nil
			for range r.IntN(6) {
				cfg.NonMasqueradeCIDRs = append(cfg.NonMasqueradeCIDRs, netip.MustParsePrefix(prefix(r.IntN(3) == 0)))
			}
		}
		for range r.IntN(3) {
			cfg.MasqueradeCIDRs = append(cfg.MasqueradeCIDRs, netip.MustParsePrefix(prefix(r.IntN(3) == 0)))
		}
		cfg.MasqLinkLocal, cfg.MasqOutBound, cfg.MasqOutBoundIPv6 = r.IntN(3) == 0, r.IntN(5) != 0, r.IntN(5) != 0
		opts := nft.Options{EnableIPv6: flags.EnableIPv6}
		o := w.Rules()
		c := Compare(o, cfg, flags, opts)
		want := nft.Build(cfg, opts)
		after := o.afterSwitch(opts)
		var probes []netip.Addr
		for _, fam := range []nft.Family{4, 6} {
			b, _ := o.bounds(fam)
			for _, a := range append(b, want.SetBounds(fam)...) {
				probes = append(probes, a, a.Prev())
			}
		}
		for range 50 {
			probes = append(probes, netip.AddrFrom4([4]byte{byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256))}))
			probes = append(probes, netip.MustParsePrefix(prefix(true)).Addr().Next())
		}
		for _, a := range probes {
			if !a.IsValid() {
				continue
			}
			before := o.decide(a).d
			now := after.decide(a)
			if !now.decided {
				now.d = NotMasqueraded
				if m, _ := want.Decider()(nft.Packet{Dst: a}); m {
					now.d = Masqueraded
				}
			}
			fam := familyOf(a)
			differs := before != now.d && (o.Removes(fam) || fam == 6 && o.Removes(4))
			reported := false
			for _, d := range c.Differences {
				reported = reported || d.Range.Contains(a)
			}
			if differs != reported {
				t.Fatalf("case %d, %s: differs %v (original %s, after %s), reported %v\n%+v\n%s\n%s", i, a, differs, before, now.d, reported, w, cfg, c.Key())
			}
		}
		for j := 1; j < len(c.Differences); j++ {
			p, d := c.Differences[j-1], c.Differences[j]
			if p.Family == d.Family && p.Range.To().Compare(d.Range.From()) >= 0 {
				t.Fatalf("case %d: ranges out of order or overlapping:\n%s", i, c.Key())
			}
		}
	}
}

// BenchmarkCompare: the addon's rules against a config of 100,000 CIDRs
// (the daemon compares again only when the rules or the config change).
func BenchmarkCompare(b *testing.B) {
	o := Written{Chain: AddonChain, NonMasq: append(append([]string{}, defaultList...), reservedList...)}.Rules()
	cfg := config.Default(config.Flags{})
	for i := range 100000 {
		cfg.NonMasqueradeCIDRs = append(cfg.NonMasqueradeCIDRs, netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(11 + i>>16), byte(i >> 8), byte(i), 0}), 24))
	}
	b.ResetTimer()
	for range b.N {
		Compare(o, cfg, config.Flags{}, nft.Options{})
	}
}

// A RETURN inserted by hand with a mask that is not a prefix
// (iptables -I IP-MASQ -d 203.0.113.0/255.0.255.0 -j RETURN: every
// 203.x.113.0/24) exempts 256 ranges the agent's default config
// masquerades: each is a difference, and the comparison stays exact.
func TestCompareNonPrefixMask(t *testing.T) {
	o := Written{NonMasq: defaultList}.Rules()
	f := &o.Families[0]
	d := nft.Daddr(4)
	ret := newXTRule(999, []expr.Any{&d,
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: []byte{255, 0, 255, 0}, Xor: make([]byte, 4)},
		&expr.Cmp{Register: 1, Op: expr.CmpOpEq, Data: []byte{203, 0, 113, 0}},
		&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictReturn}}, nil)
	f.Rules = append([]XTRule{ret}, f.Rules...)
	c := Compare(o, config.Default(config.Flags{}), config.Flags{}, nft.Options{})
	if c.Inexact {
		t.Error("a non-prefix mask of 8 free bits: inexact")
	}
	if len(c.Differences) != 256 {
		t.Fatalf("%d differences, want 256 (203.x.113.0/24):\n%s", len(c.Differences), strings.Join(c.Summary(5), "\n"))
	}
	for i, want := range map[int]string{0: "203.0.113.0/24", 1: "203.1.113.0/24", 255: "203.255.113.0/24"} {
		if d := c.Differences[i]; d.RangeString() != want || d.Original != NotMasqueraded || d.Agent != Masqueraded {
			t.Errorf("difference %d: %s, want %s not masqueraded -> masquerade", i, d, want)
		}
	}
	// Too many pieces to list: inexact, never "no change".
	ret.exprs[1].(*expr.Bitwise).Mask = []byte{255, 0, 0, 255}
	f.Rules[0] = ret
	if c := Compare(o, config.Default(config.Flags{}), config.Flags{}, nft.Options{}); !c.Inexact {
		t.Errorf("a mask of 16 free bits before its last: not inexact (%d differences)", len(c.Differences))
	}
}

// An exemption in a chain that nat POSTROUTING jumps to before the
// original's jump (-A POSTROUTING -j MY-EXEMPT; -A MY-EXEMPT -d
// 198.51.100.0/24 -j ACCEPT) kept that range from the original's
// masquerade as one in POSTROUTING does; this agent's table, after it,
// masquerades it: a difference. A RETURN there only returns to
// POSTROUTING: none.
func TestCompareExemptionInSubchain(t *testing.T) {
	o := Written{NonMasq: defaultList}.Rules()
	f := o.Families[0]
	toSub := newXTRule(50, []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictJump, Chain: "MY-EXEMPT"}}, nil)
	sub := []XTRule{
		newXTRule(51, append(daddrPrefix(4, netip.MustParsePrefix("198.51.100.0/24")), &expr.Counter{}, &expr.Verdict{Kind: expr.VerdictAccept}), nil),
		newXTRule(52, append(daddrPrefix(4, netip.MustParsePrefix("192.0.2.0/24")), &expr.Counter{}, &expr.Verdict{Kind: expr.VerdictReturn}), nil),
	}
	fams := withJumps(4, "", []XTRule{toSub, f.Jumps[0]}, []Family{{Family: 4, Chain: f.Chain, ChainPresent: true, ChainHandle: f.ChainHandle, Rules: f.Rules}},
		map[string][]XTRule{"MY-EXEMPT": sub})
	o.Families = append(fams, o.Families[1:]...)
	c := Compare(o, config.Default(config.Flags{}), config.Flags{}, nft.Options{})
	if len(c.Differences) != 1 || c.Differences[0].RangeString() != "198.51.100.0/24" || !strings.HasPrefix(c.Differences[0].Fix, "nonMasqueradeCIDRs: add 198.51.100.0/24 (a rule in nat POSTROUTING") {
		t.Errorf("an exemption in a chain jumped to before the original's jump:\n%s", c.Key())
	}
	if e, _ := o.ExplainOriginal(netip.MustParseAddr("198.51.100.10"), false); !strings.Contains(e.Reason, "MY-EXEMPT") {
		t.Errorf("explain: %q", e.Reason)
	}
}

// At decides one address exactly where the comparison is inexact: the
// hand edit's 8.113.0.1 (returned by the original, masqueraded by this
// agent) is a change, 8.8.8.8 (masqueraded by both) is none.
func TestCompareAt(t *testing.T) {
	o := Written{NonMasq: defaultList, HandEdited: true}.Rules()
	cfg := config.Default(config.Flags{})
	if c := Compare(o, cfg, config.Flags{}, nft.Options{}); !c.Inexact {
		t.Fatal("not inexact")
	}
	d, ok := At(o, cfg, config.Flags{}, nft.Options{}, netip.MustParseAddr("8.113.0.1"))
	if !ok || d.Original != NotMasqueraded || d.Agent != Masqueraded || d.RangeString() != "8.113.0.1/32" {
		t.Errorf("8.113.0.1: %v %s", ok, d)
	}
	if d, ok := At(o, cfg, config.Flags{}, nft.Options{}, netip.MustParseAddr("8.8.8.8")); ok {
		t.Errorf("8.8.8.8: %s", d)
	}
}

// The original's MASQUERADE --to-ports (kept off the NodePort range, say)
// and --random-fully, when this agent's flags differ, are said: the switch
// changes which source ports masqueraded traffic gets, not whether.
func TestCompareMasqueradeOptions(t *testing.T) {
	o := Written{NonMasq: defaultList}.Rules()
	rs := o.Families[0].Rules
	last := &rs[len(rs)-1]
	last.exprs = []expr.Any{&expr.Counter{}, &expr.Target{Name: "MASQUERADE", Info: &xt.NatIPv4MultiRangeCompat{{
		Flags: uint(xt.NatRangeProtoSpecified | xt.NatRangeProtoRandomFully), MinIP: net.IPv4zero, MaxIP: net.IPv4zero, MinPort: 1024, MaxPort: 29999}}}}
	cfg := config.Default(config.Flags{})
	c := Compare(o, cfg, config.Flags{}, nft.Options{RandomFully: true})
	if len(c.Notes) != 1 || !strings.Contains(c.Notes[0], "--to-ports=1024-29999") || c.Key() == "" {
		t.Errorf("--to-ports not carried over: %q", c.Notes)
	}
	if c := Compare(o, cfg, config.Flags{}, nft.Options{RandomFully: true, ToPorts: []nft.PortRange{{First: 1024, Last: 29999}}}); len(c.Notes) != 0 {
		t.Errorf("carried over: %q", c.Notes)
	}
	c = Compare(o, cfg, config.Flags{}, nft.Options{ToPorts: []nft.PortRange{{First: 1024, Last: 29999}}})
	if len(c.Notes) != 1 || !strings.Contains(c.Notes[0], "--random-fully") {
		t.Errorf("--random-fully not carried over: %q", c.Notes)
	}
}

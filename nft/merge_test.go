package nft

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"go4.org/netipx"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
)

// The sets hold one range per listed prefix: nested ones dropped,
// adjacent ones kept apart (paint says why: the lookup of Linux before
// 7.0 during a commit).
func TestRangesOfOnePerPrefix(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want string
	}{
		{[]string{"10.0.0.0/24", "10.0.1.0/24", "10.0.2.0/23"}, "10.0.0.0/24 10.0.1.0/24 10.0.2.0/23"},
		{[]string{"10.0.2.0/24", "10.0.0.0/8", "10.1.0.0/16"}, "10.0.0.0/8"},
		{[]string{"10.0.0.0/24", "10.0.2.0/24", "10.0.0.0/24"}, "10.0.0.0/24 10.0.2.0/24"},
		{[]string{"0.0.0.0/1", "128.0.0.0/1"}, "0.0.0.0/1 128.0.0.0/1"},
		{[]string{"2001:db8::/33", "2001:db8:8000::/33", "2001:db8::/48"}, "2001:db8::/33 2001:db8:8000::/33"},
		{nil, ""},
	} {
		var got []string
		for _, r := range rangesOf(prefixes(tc.in...)) {
			got = append(got, rangeString(r))
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("rangesOf(%v) = %v, want %s", tc.in, got, tc.want)
		}
	}
}

// With MergeAdjacent, adjacent ranges of a set are one element; interface
// names never join.
func TestBuildMergeAdjacent(t *testing.T) {
	c := config.Default(config.Flags{})
	c.NonMasqueradeCIDRs = prefixes("10.0.0.0/24", "10.0.1.0/24", "10.0.2.0/23", "192.0.2.0/24")
	merged, apart := Build(c, Options{Chain: DefaultChain, MergeAdjacent: true}), Build(c, Options{Chain: DefaultChain})
	got := merged.Set(SetNonMasqV4).Elements
	var s []string
	for _, r := range got {
		s = append(s, rangeString(r))
	}
	if want := "10.0.0.0/22 169.254.0.0/16 192.0.2.0/24"; strings.Join(s, " ") != want {
		t.Errorf("merged: %v, want %s", s, want)
	}
	if n := len(apart.Set(SetNonMasqV4).Elements); n != 5 {
		t.Errorf("apart: %d elements, want 5", n)
	}
}

// randomPrefixes returns n prefixes of family f crowded into a small
// space (10.0.0.0/16, 2001:db8::/112), so that they nest and touch.
func randomPrefixes(r *rand.Rand, n int, f Family) []netip.Prefix {
	var ps []netip.Prefix
	for range n {
		if f == 4 {
			a := netip.AddrFrom4([4]byte{10, 0, byte(r.IntN(4)), byte(r.IntN(256))})
			p, _ := a.Prefix(14 + r.IntN(19))
			ps = append(ps, p)
		} else {
			b := netip.MustParseAddr("2001:db8::").As16()
			b[14], b[15] = byte(r.IntN(4)), byte(r.IntN(256))
			p, _ := netip.AddrFrom16(b).Prefix(110 + r.IntN(19))
			ps = append(ps, p)
		}
	}
	return ps
}

// randomAddr returns an address in (or near) randomPrefixes' space.
func randomAddr(r *rand.Rand, f Family) netip.Addr {
	if f == 4 {
		if r.IntN(8) == 0 {
			return netip.AddrFrom4([4]byte{169, 254, byte(r.IntN(256)), byte(r.IntN(256))})
		}
		return netip.AddrFrom4([4]byte{10, byte(r.IntN(2)), byte(r.IntN(5)), byte(r.IntN(256))})
	}
	b := netip.MustParseAddr("2001:db8::").As16()
	b[13], b[14], b[15] = byte(r.IntN(2)), byte(r.IntN(5)), byte(r.IntN(256))
	if r.IntN(8) == 0 {
		b = netip.MustParseAddr("fe80::").As16()
		b[15] = byte(r.IntN(256))
	}
	return netip.AddrFrom16(b)
}

func randomConfig(r *rand.Rand, match config.CIDRMatch) config.Config {
	c := config.Default(config.Flags{EnableIPv6: true})
	c.CIDRMatch = match
	c.NonMasqueradeCIDRs = append(randomPrefixes(r, r.IntN(20), 4), randomPrefixes(r, r.IntN(20), 6)...)
	c.MasqueradeCIDRs = append(randomPrefixes(r, r.IntN(8), 4), randomPrefixes(r, r.IntN(8), 6)...)
	if r.IntN(4) == 0 {
		c.MasqueradeCIDRs = append(c.MasqueradeCIDRs, prefixes("169.254.0.0/16", "169.254.7.0/24", "fe80::/10")[r.IntN(3)])
	}
	c.MasqLinkLocal, c.MasqLinkLocalIPv6 = r.IntN(2) == 0, r.IntN(2) == 0
	c.MasqOutBound, c.MasqOutBoundIPv6 = r.IntN(2) == 0, r.IntN(2) == 0
	if match == config.MostSpecific { // a CIDR in both lists is refused (config)
		in := map[netip.Prefix]bool{}
		for _, p := range c.NonMasqueradeCIDRs {
			in[p.Masked()] = true
		}
		var masq []netip.Prefix
		for _, p := range c.MasqueradeCIDRs {
			if !in[p.Masked()] {
				masq = append(masq, p)
			}
		}
		c.MasqueradeCIDRs = masq
	}
	return c
}

func linkLocal(c config.Config, a netip.Addr) []netip.Prefix {
	if a.Is4() && !c.MasqLinkLocal {
		return []netip.Prefix{config.LinkLocalIPv4}
	}
	if a.Is6() && !c.MasqLinkLocalIPv6 {
		return []netip.Prefix{config.LinkLocalIPv6}
	}
	return nil
}

func outBound(c config.Config, a netip.Addr) bool {
	if a.Is4() {
		return c.MasqOutBound
	}
	return c.MasqOutBoundIPv6
}

// listOrder, naively: any masqueradeCIDRs entry wins, then any
// nonMasqueradeCIDRs entry (or link-local), then masqOutBound.
func refListOrder(c config.Config, a netip.Addr) bool {
	for _, p := range c.MasqueradeCIDRs {
		if p.Contains(a) {
			return true
		}
	}
	for _, p := range append(linkLocal(c, a), c.NonMasqueradeCIDRs...) {
		if p.Contains(a) {
			return false
		}
	}
	return outBound(c, a)
}

// mostSpecific, naively: the longest prefix of both lists (and
// link-local) holding a decides; a tie goes to masqueradeCIDRs.
func refMostSpecific(c config.Config, a netip.Addr) bool {
	best, masq := -1, false
	for _, p := range c.MasqueradeCIDRs {
		if p.Contains(a) && p.Bits() > best {
			best, masq = p.Bits(), true
		}
	}
	for _, p := range append(linkLocal(c, a), c.NonMasqueradeCIDRs...) {
		if p.Contains(a) && p.Bits() > best {
			best, masq = p.Bits(), false
		}
	}
	if best < 0 {
		return outBound(c, a)
	}
	return masq
}

// checkMinimal fails unless every set's elements are sorted, disjoint and
// apart (no two that touch: they would be one).
func checkMinimal(t *testing.T, tb Table) {
	t.Helper()
	for _, s := range tb.Sets {
		for i := 1; i < len(s.Elements); i++ {
			if s.Elements[i-1].To().Compare(s.Elements[i].From()) >= 0 {
				t.Fatalf("set %s: elements %s and %s overlap or are out of order", s.Name, rangeString(s.Elements[i-1]), rangeString(s.Elements[i]))
			}
		}
	}
}

// checkJoined: no two ranges of an address set of merged touch, and each
// set covers what apart's does (Options.MergeAdjacent).
func checkJoined(t *testing.T, merged, apart Table) {
	t.Helper()
	for _, s := range merged.Sets {
		if s.Key == KeyIfname {
			continue
		}
		for i := 1; i < len(s.Elements); i++ {
			if s.Elements[i-1].To().Next() == s.Elements[i].From() {
				t.Fatalf("set %s: elements %s and %s touch: not joined", s.Name, rangeString(s.Elements[i-1]), rangeString(s.Elements[i]))
			}
		}
		var b, c netipx.IPSetBuilder
		for _, r := range s.Elements {
			b.AddRange(r.IPRange())
		}
		for _, r := range apart.Set(s.Name).Elements {
			c.AddRange(r.IPRange())
		}
		x, _ := b.IPSet()
		y, _ := c.IPSet()
		if !x.Equal(y) {
			t.Fatalf("set %s: joined covers %v, apart %v", s.Name, x.Ranges(), y.Ranges())
		}
	}
}

// For random CIDR lists, the merged sets decide exactly as the unmerged
// lists do, for random addresses, under both cidrMatch values; and
// explain's reason names a listed CIDR that holds the address.
func TestMergedSetsDecideAsLists(t *testing.T) {
	r := rand.New(rand.NewPCG(34, 33))
	for _, match := range []config.CIDRMatch{config.ListOrder, config.MostSpecific} {
		ref := refListOrder
		if match == config.MostSpecific {
			ref = refMostSpecific
		}
		for i := range 150 {
			c := randomConfig(r, match)
			// Every other config with adjacent ranges joined, as on a
			// kernel whose lookup is the array's.
			o := Options{Chain: DefaultChain, EnableIPv6: true, MergeAdjacent: i%2 == 1}
			tb := Build(c, o)
			checkMinimal(t, tb)
			if o.MergeAdjacent {
				checkJoined(t, tb, Build(c, Options{Chain: DefaultChain, EnableIPv6: true}))
			}
			for k := range 100 {
				f := Family(4)
				if r.IntN(2) == 0 {
					f = 6
				}
				a := randomAddr(r, f)
				p := Packet{Src: pod(a), Dst: a}
				got, handled := tb.Decide(p)
				if want := ref(c, a); !handled || got != want {
					t.Fatalf("%s: %s: masquerade %v (handled %v), want %v; config:\n%s\ntable:\n%s", match, a, got, handled, want, c, Render(tb))
				}
				if k%10 != 0 {
					continue // explain builds the table again: every tenth address
				}
				e := Explain(c, o, p)
				if e.Masquerade != got {
					t.Fatalf("%s: explain %s: %v, decide %v", match, a, e.Masquerade, got)
				}
				if p, ok := reasonPrefix(e.Reason); ok && !p.Contains(a) {
					t.Fatalf("%s: explain %s names %s, which does not hold it: %s", match, a, p, e.Reason)
				}
				named := strings.HasPrefix(e.Reason, config.KeyMasq+"[")
				if listed := named || strings.HasPrefix(e.Reason, config.KeyNonMasq+"[") || strings.HasPrefix(e.Reason, "link-local"); listed && named != got {
					t.Fatalf("%s: explain %s: %q, but masquerade is %v", match, a, e.Reason, got)
				}
			}
		}
	}
}

// reasonPrefix is the CIDR a reason names ("key[i] CIDR ...").
func reasonPrefix(reason string) (netip.Prefix, bool) {
	f := strings.Fields(reason)
	if len(f) < 2 {
		return netip.Prefix{}, false
	}
	p, err := netip.ParsePrefix(f[1])
	return p, err == nil
}

// The example: 10/8 not masqueraded, 10.20/16 masqueraded,
// 10.20.30/24 not; explain names the CIDR that decided.
func TestMostSpecificThreeLevels(t *testing.T) {
	yaml := "cidrMatch: mostSpecific\nnonMasqueradeCIDRs: [10.0.0.0/8, 10.20.30.0/24]\nmasqueradeCIDRs: [10.20.0.0/16]\nmasqOutBound: true\n"
	c, _, err := config.Parse([]byte(yaml), config.Flags{})
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Chain: DefaultChain}
	tb := Build(c, o)
	var elems []string
	for _, s := range tb.Sets {
		for _, r := range s.Elements {
			elems = append(elems, s.Name+":"+rangeString(r))
		}
	}
	want := "masq-v4:10.20.0.0-10.20.29.255 masq-v4:10.20.31.0-10.20.255.255 nonmasq-v4:10.0.0.0-10.19.255.255 nonmasq-v4:10.20.30.0/24 nonmasq-v4:10.21.0.0-10.255.255.255 nonmasq-v4:169.254.0.0/16"
	if got := strings.Join(elems, " "); got != want {
		t.Errorf("sets:\n%s\nwant\n%s", got, want)
	}
	for _, tc := range []struct {
		dst    string
		masq   bool
		reason string
	}{
		{"10.1.2.3", false, "nonMasqueradeCIDRs[0] 10.0.0.0/8 (the most specific CIDR; cidrMatch: mostSpecific) (set element 10.0.0.0-10.19.255.255)"},
		{"10.20.1.1", true, "masqueradeCIDRs[0] 10.20.0.0/16 (the most specific CIDR; cidrMatch: mostSpecific) (set element 10.20.0.0-10.20.29.255)"},
		{"10.20.30.4", false, "nonMasqueradeCIDRs[1] 10.20.30.0/24 (the most specific CIDR; cidrMatch: mostSpecific)"},
		{"192.0.2.1", true, "masqOutBound: true (no other rule matched)"},
	} {
		e := Explain(c, o, Packet{Dst: netip.MustParseAddr(tc.dst)})
		if e.Masquerade != tc.masq || e.Reason != tc.reason {
			t.Errorf("Explain(%s) = %v %q, want %v %q", tc.dst, e.Masquerade, e.Reason, tc.masq, tc.reason)
		}
	}
}

// explain names the listed CIDR, each its own element beside adjacent
// ones; a nested one is named by the widest that holds it.
func TestExplainAdjacent(t *testing.T) {
	c := config.Default(config.Flags{})
	c.NonMasqueradeCIDRs = prefixes("192.168.0.0/16", "10.0.0.0/24", "172.16.0.0/12", "10.0.1.0/24", "10.0.2.0/23", "10.0.2.128/25")
	for dst, want := range map[string]string{"10.0.1.9": "nonMasqueradeCIDRs[3] 10.0.1.0/24", "10.0.2.130": "nonMasqueradeCIDRs[4] 10.0.2.0/23"} {
		e := Explain(c, Options{Chain: DefaultChain}, Packet{Dst: netip.MustParseAddr(dst)})
		if e.Masquerade || e.Reason != want {
			t.Errorf("Explain(%s) = %v %q, want %q", dst, e.Masquerade, e.Reason, want)
		}
	}
}

// A one-CIDR change is a one-element delta: adding a /24 between two
// listed ones adds it alone, and the elements beside it are not touched.
func TestPlanAdjacentDelta(t *testing.T) {
	c := config.Default(config.Flags{})
	for i := range 1000 {
		c.NonMasqueradeCIDRs = append(c.NonMasqueradeCIDRs, netip.PrefixFrom(netip.AddrFrom4([4]byte{100, byte(i / 128), byte(2 * (i % 128)), 0}), 24))
	}
	o := Options{Chain: DefaultChain}
	old := Build(c, o)
	c.NonMasqueradeCIDRs = append(c.NonMasqueradeCIDRs, netip.MustParsePrefix("100.0.1.0/24")) // joins 100.0.0.0/24 and 100.0.2.0/24
	plan, err := PlanFor(&old, Build(c, o))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, op := range plan.Ops {
		got = append(got, op.String())
	}
	if len(plan.Ops) != 1 || plan.Ops[0].Verb != Add || len(plan.Ops[0].Elements) != 1 ||
		plan.Ops[0].Elements[0] != mustRange("100.0.1.0-100.0.1.255") {
		t.Errorf("plan: %q, want an add of 100.0.1.0/24 alone", got)
	}
}

// paintReference is paint with netipx's IPSetBuilder: by prefix length,
// shortest first, each list's prefixes of that length removed from the
// others and added to its own, an earlier list last (it wins a tie).
func paintReference(lists []painted) [][]Range {
	bs := make([]netipx.IPSetBuilder, len(lists))
	for bits := 0; bits <= 128; bits++ {
		for i := len(lists) - 1; i >= 0; i-- {
			var lb netipx.IPSetBuilder
			for _, p := range lists[i] {
				if p.Bits() == bits {
					lb.AddPrefix(p.Masked())
				}
			}
			level, _ := lb.IPSet()
			for j := range bs {
				if j != i {
					bs[j].RemoveSet(level)
				}
			}
			bs[i].AddSet(level)
		}
	}
	out := make([][]Range, len(lists))
	for i := range bs {
		s, _ := bs[i].IPSet()
		for _, r := range s.Ranges() {
			out[i] = append(out[i], rangeOf(r))
		}
	}
	return out
}

// paint covers what IPSetBuilder gives, for random lists of both
// families, with the top and the bottom of the address space, in ranges
// that each lie in one outermost listed prefix.
func TestPaintAsIPSetBuilder(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	edges := prefixes("0.0.0.0/0", "255.255.255.255/32", "255.255.255.0/24", "0.0.0.0/32", "::/0", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128")
	for range 2000 {
		f := Family(4)
		if r.IntN(2) == 0 {
			f = 6
		}
		lists := make([]painted, 1+r.IntN(3))
		for i := range lists {
			lists[i] = randomPrefixes(r, r.IntN(30), f)
			for _, e := range edges {
				if r.IntN(10) == 0 && (e.Addr().Is4() == (f == 4)) {
					lists[i] = append(lists[i], e)
				}
			}
		}
		got, want := paint(lists), paintReference(lists)
		var all []netip.Prefix
		for _, l := range lists {
			all = append(all, l...)
		}
		roots := Normalize(all)
		for i := range lists {
			var b netipx.IPSetBuilder
			for j, r := range got[i] {
				b.AddRange(r.IPRange())
				if j > 0 && got[i][j-1].To().Compare(r.From()) >= 0 {
					t.Fatalf("lists %v: list %d painted %v: out of order or overlapping", lists, i, got[i])
				}
				if !slices.ContainsFunc(roots, func(p netip.Prefix) bool { return p.Contains(r.From()) && p.Contains(r.To()) }) {
					t.Fatalf("lists %v: list %d painted %v: %s spans two outermost prefixes", lists, i, got[i], rangeString(r))
				}
			}
			union, _ := b.IPSet()
			var covers []Range
			for _, r := range union.Ranges() {
				covers = append(covers, rangeOf(r))
			}
			if !slices.Equal(covers, want[i]) {
				t.Fatalf("lists %v: list %d painted %v, covering %v, want %v", lists, i, got[i], covers, want[i])
			}
		}
	}
}

// union4, rangesOf's integer path for IPv4, gives what paint gives (one
// range per outermost prefix) for random lists in any order (sorted ones
// too: its sort is skipped), with the top and the bottom of the address
// space.
func TestUnion4AsPaint(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	edges := prefixes("0.0.0.0/0", "255.255.255.255/32", "255.255.255.0/24", "0.0.0.0/32", "128.0.0.0/1")
	for range 3000 {
		ps := randomPrefixes(r, r.IntN(40), 4)
		for _, e := range edges {
			if r.IntN(10) == 0 {
				ps = append(ps, e)
			}
		}
		if r.IntN(3) == 0 {
			slices.SortFunc(ps, comparePrefix)
		}
		want := paint([]painted{ps})[0] // one range per outermost prefix (TestPaintAsIPSetBuilder)
		if got := union4(ps); !slices.Equal(got, want) {
			t.Fatalf("union4(%v) = %v; want %v", ps, got, want)
		}
		// In two lists, with IPv6 and IPv4-mapped prefixes among them.
		k := r.IntN(len(ps) + 1)
		a, b := slices.Clone(ps[:k]), slices.Clone(ps[k:])
		for i, p := range a {
			if r.IntN(4) == 0 {
				a[i] = netip.PrefixFrom(netip.AddrFrom16(p.Addr().As16()), p.Bits()+96)
			}
		}
		b = append(b, prefixes("fd00::/8", "::/0")...)
		if got := union4(a, b); !slices.Equal(got, want) {
			t.Fatalf("union4(%v, %v) = %v; want %v", a, b, got, want)
		}
	}
}

// diffRanges, which skips the equal runs at both ends, gives the ranges
// of each list that the other lacks, in order.
func TestDiffRanges(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	lacks := func(a, b []Range) (out []Range) {
		for _, x := range a {
			if !slices.Contains(b, x) {
				out = append(out, x)
			}
		}
		return out
	}
	for range 3000 {
		old := rangesOf(randomPrefixes(r, r.IntN(30), 4))
		ps := randomPrefixes(r, r.IntN(30), 4)
		if r.IntN(2) == 0 {
			// A few elements off the old list: long equal runs.
			ps = nil
			for _, x := range old {
				if r.IntN(8) != 0 {
					ps = append(ps, x.Prefixes()...)
				}
			}
			ps = append(ps, randomPrefixes(r, r.IntN(3), 4)...)
		}
		new := rangesOf(ps)
		removed, added := diffRanges(old, new)
		if !slices.Equal(removed, lacks(old, new)) || !slices.Equal(added, lacks(new, old)) {
			t.Fatalf("diffRanges(%v, %v) = %v, %v", old, new, removed, added)
		}
	}
}

func mustRange(s string) Range { return rangeOf(netipx.MustParseIPRange(s)) }

package nft

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"go4.org/netipx"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
)

// FuzzBuild builds the ruleset of a config made from the fuzzer's bytes and
// checks it against a reference model written from the README, on the
// edges of every prefix of the config and on pseudo-random addresses:
//
//   - an address is masqueraded by the generated rules (the Table's
//     chains evaluated in Go, with set membership taken from the
//     ranges AND from the interval elements sent to the
//     kernel) exactly when the model says so;
//   - every set holds one range per normalized prefix: masked, sorted, of the set's family,
//     pairwise disjoint, and covering exactly what the config listed;
//   - every rule encodes to a netlink message, the table renders, and
//     the plan that creates it makes it;
//   - built with MergeAdjacent, each set covers the same addresses with
//     no two ranges touching, and decides as the model does.
//
// The seed corpus is in testdata/fuzz/FuzzBuild; `make fuzz-ci` runs it for
// a fixed time, `go test` runs the seeds.
func FuzzBuild(f *testing.F) {
	seeds := []struct {
		data                         []byte
		ipv6, ll, ll6, out, out6, rf bool
		ports                        uint32
	}{
		{nil, false, false, false, true, true, true, 0},
		{[]byte{0x00, 10, 0, 0, 0, 8, 0x02, 10, 250, 0, 0, 24}, false, false, false, true, true, true, 0},
		{[]byte{0x01, 0xfd, 0, 0, 0, 0, 0, 8, 0x03, 0x20, 0x01, 0x0d, 0xb8, 0, 0, 32}, true, false, true, false, true, false, 1024<<16 | 29999},
		{[]byte{0x04, 10, 0, 0, 0, 104, 0x00, 0, 0, 0, 0, 0, 0x02, 0, 0, 0, 0, 0}, true, true, false, true, false, true, 0},
		{[]byte{0x00, 240, 0, 0, 0, 4, 0x00, 255, 255, 255, 255, 32, 0x01, 0xff, 0xff, 0, 0, 0, 16}, true, false, false, true, true, true, 32768<<16 | 65535},
		{[]byte{0x00, 169, 254, 0, 0, 16, 0x02, 169, 254, 169, 254, 32, 0x01, 0xfe, 0x80, 0, 0, 0, 10}, true, true, true, false, false, true, 0},
		{[]byte{0x00, 192, 168, 1, 0, 24, 0x00, 192, 168, 0, 0, 16, 0x00, 192, 168, 0, 0, 23, 0x00, 192, 169, 0, 0, 16}, false, false, false, true, true, true, 0},
	}
	for _, s := range seeds {
		f.Add(s.data, s.ipv6, s.ll, s.ll6, s.out, s.out6, s.rf, s.ports)
	}
	f.Fuzz(func(t *testing.T, data []byte, ipv6, ll, ll6, out, out6, rf bool, ports uint32) {
		if len(data) > maxFuzzBytes {
			data = data[:maxFuzzBytes] // at most ~800 prefixes: enough to overlap in every way, fast to check
		}
		cfg := fuzzConfig(data)
		cfg.MasqLinkLocal, cfg.MasqLinkLocalIPv6, cfg.MasqOutBound, cfg.MasqOutBoundIPv6 = ll, ll6, out, out6
		o := Options{Chain: DefaultChain, EnableIPv6: ipv6, RandomFully: rf, ToPorts: fuzzPorts(ports)}
		if len(data) > 0 && data[0]&0x80 != 0 {
			o.Chain = "MY-CHAIN"
		}
		rs := Build(cfg, o)

		checkSets(t, cfg, o, rs)
		checkMasqChain(t, o, rs)
		for _, c := range rs.Chains {
			for _, r := range c.Rules {
				if got := FoundRule(r.Encode(), r.Comment); got.Foreign != "" || !got.equal(r) {
					t.Fatalf("rule %q does not decode as itself: %q", RenderRule(r), RenderRule(got))
				}
			}
		}
		// The plan from nothing makes the table.
		if got, err := ExecPlan(nil, create(rs, true)); err != nil || !rs.Equal(*got) {
			t.Fatalf("the create plan does not make the table: %v", err)
		}
		if !strings.Contains(Render(rs), "table inet "+TableName) {
			t.Fatal("Render lost the table")
		}

		h := fnv.New64a()
		h.Write(data)
		rng := rand.New(rand.NewPCG(h.Sum64(), uint64(len(data))))
		// Joined (MergeAdjacent: the layout on a kernel whose interval
		// lookup is the array's): the same addresses in each set, no two
		// ranges touching, made by its create plan, the same decisions.
		jo := o
		jo.MergeAdjacent = true
		js := Build(cfg, jo)
		checkJoined(t, js, rs)
		if got, err := ExecPlan(nil, create(js, true)); err != nil || !js.Equal(*got) {
			t.Fatalf("the create plan does not make the joined table: %v", err)
		}
		for _, a := range probeAddrs(cfg, rng) {
			want := modelMasquerades(cfg, o, a)
			for _, x := range []struct {
				layout string
				t      Table
			}{{"apart", rs}, {"joined", js}} {
				if got, trace := evalRuleset(t, x.t, a); got != want {
					t.Fatalf("%s: the ruleset (%s) says masquerade=%v (%s), the model says %v\nconfig:\n%s\nruleset:\n%s",
						a, x.layout, got, trace, want, cfg, Render(x.t))
				}
			}
		}
	})
}

// maxFuzzBytes bounds the input FuzzBuild reads.
const maxFuzzBytes = 4096

// fuzzConfig turns bytes into CIDR lists. Each entry is a kind byte and an
// address: bit 0 selects IPv6 (5 bytes: the top 4 bytes of the address,
// then the prefix length; the last byte of the address gets the top bits
// of the kind byte, so that nearby prefixes overlap), else IPv4 (4 bytes
// and the prefix length); bit 1 selects masqueradeCIDRs; bit 2 writes an
// IPv4 prefix IPv4-mapped (::ffff:a.b.c.d/96+n). Prefixes are masked as
// config.Parse requires; prefix lengths wrap modulo the address size + 1.
func fuzzConfig(data []byte) config.Config {
	cfg := config.Config{
		NonMasqueradeCIDRs: []netip.Prefix{}, ResyncInterval: time.Minute, CIDRLimit: 1 << 20,
	}
	for len(data) > 0 {
		kind := data[0]
		n := 5
		if kind&1 != 0 {
			n = 6
		}
		if len(data) < n {
			break
		}
		b, bits := data[1:n], int(data[n-1])
		data = data[n:]
		var p netip.Prefix
		if kind&1 != 0 {
			var a [16]byte
			copy(a[:], b[:4])
			a[15] = kind >> 3
			p = netip.PrefixFrom(netip.AddrFrom16(a), bits%129).Masked()
		} else {
			a := netip.AddrFrom4([4]byte(b[:4]))
			p = netip.PrefixFrom(a, bits%33).Masked()
			if kind&4 != 0 {
				p = netip.PrefixFrom(netip.AddrFrom16(p.Addr().As16()), 96+p.Bits())
			}
		}
		if kind&2 != 0 {
			cfg.MasqueradeCIDRs = append(cfg.MasqueradeCIDRs, p)
		} else {
			cfg.NonMasqueradeCIDRs = append(cfg.NonMasqueradeCIDRs, p)
		}
	}
	return cfg
}

// fuzzPorts makes zero, one or two --to-ports ranges from 32 bits.
func fuzzPorts(v uint32) []PortRange {
	lo, hi := uint16(v>>16), uint16(v)
	switch {
	case v == 0 || lo == 0:
		return nil
	case lo <= hi:
		return []PortRange{{lo, hi}}
	case hi == 0:
		return []PortRange{{lo, lo}}
	default: // two ranges: [hi, hi] and [lo, lo], disjoint since hi < lo
		return []PortRange{{hi, hi}, {lo, lo}}
	}
}

// unmapped returns p as the agent reads it: an IPv4-mapped prefix of at
// least 96 bits is the IPv4 prefix (README: ::ffff:10.0.0.0/104 is 10.0.0.0/8).
func unmapped(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		return netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p
}

// modelMasquerades is the README's decision for a new connection to a
// non-local destination a, written independently of Build: masqueradeCIDRs
// first, then nonMasqueradeCIDRs and link-local (unless masqLinkLocal*),
// then masqOutBound* of the family; IPv6 only with --enable-ipv6.
func modelMasquerades(c config.Config, o Options, a netip.Addr) bool {
	if a.Is6() && !o.EnableIPv6 {
		return false
	}
	in := func(list []netip.Prefix) bool {
		for _, p := range list {
			if p = unmapped(p); p.Addr().BitLen() == a.BitLen() && p.Contains(a) {
				return true
			}
		}
		return false
	}
	switch {
	case in(c.MasqueradeCIDRs):
		return true
	case in(c.NonMasqueradeCIDRs):
		return false
	case a.Is4() && !c.MasqLinkLocal && config.LinkLocalIPv4.Contains(a):
		return false
	case a.Is6() && !c.MasqLinkLocalIPv6 && config.LinkLocalIPv6.Contains(a):
		return false
	case a.Is4():
		return c.MasqOutBound
	default:
		return c.MasqOutBoundIPv6
	}
}

// evalRuleset runs a packet to a through the base chain and the decision
// chain as the kernel would (fib says non-local), and reports whether it
// reaches the masquerade chain, with the rules it took.
func evalRuleset(t *testing.T, rs Table, a netip.Addr) (bool, string) {
	fam := Family(4)
	if a.Is6() {
		fam = 6
	}
	sets := map[string]Set{}
	for _, s := range rs.Sets {
		sets[s.Name] = s
	}
	matches := func(r Rule) bool {
		if r.Family != 0 && r.Family != fam {
			return false
		}
		if r.Set != "" {
			s, ok := sets[r.Set]
			if !ok {
				t.Fatalf("rule %q looks up a set that does not exist", RenderRule(r))
			}
			if s.Key.Family() != fam {
				return false // ip daddr @set never matches an IPv6 packet, and the reverse
			}
			byPrefix, byElements := inRanges(s.Elements, a), inIntervals(Bounds(s.Elements), a)
			if byPrefix != byElements {
				t.Fatalf("%s: set %s: the normalized prefixes say %v, the interval elements sent to the kernel say %v",
					a, s.Name, byPrefix, byElements)
			}
			return byPrefix
		}
		return r.L4Proto == 0 && r.Share == nil
	}
	var trace []string
	decision := rs.DecisionChain()
	if decision == nil || rs.Chain(BaseChainName) == nil {
		t.Fatalf("no base or decision chain:\n%s", Render(rs))
	}
	for _, base := range rs.Chain(BaseChainName).Rules {
		if !matches(base) {
			continue
		}
		if base.Verdict != Jump || base.Target != decision.Name {
			t.Fatalf("base chain rule %q: want a jump to %s", RenderRule(base), decision.Name)
		}
		for _, r := range decision.Rules {
			if !matches(r) {
				continue
			}
			trace = append(trace, r.Comment)
			switch r.Verdict {
			case Goto:
				if r.Target != MasqChainName {
					t.Fatalf("rule %q goes to %q", RenderRule(r), r.Target)
				}
				return true, strings.Join(trace, " / ")
			case Return:
				return false, strings.Join(trace, " / ")
			default:
				t.Fatalf("unexpected verdict in the decision chain: %q", RenderRule(r))
			}
		}
		trace = append(trace, "fell off the end of "+decision.Name)
	}
	return false, strings.Join(append(trace, "base chain policy accept"), " / ")
}

func inRanges(rs []Range, a netip.Addr) bool {
	// Sorted and disjoint (checkSets): the only candidate is the last
	// range that starts at or before a.
	i, _ := slices.BinarySearchFunc(rs, a, func(r Range, a netip.Addr) int { return r.From().Compare(a) })
	if i < len(rs) && rs[i].From() == a {
		return true
	}
	return i > 0 && rs[i-1].Contains(a)
}

// inIntervals evaluates an interval set as the kernel does: an element
// starts an interval that ends before the next element flagged as an
// interval end, or at the top of the address space if there is none.
func inIntervals(elems []Bound, a netip.Addr) bool {
	// The elements are sorted by key (an end and the next start may share
	// one, the end first): the last element at or below a decides.
	i := sort.Search(len(elems), func(i int) bool { return elems[i].Addr.Compare(a) > 0 })
	return i > 0 && !elems[i-1].End
}

// checkSets checks that each set is normalized and covers exactly the
// config's prefixes of its kind and family (plus link-local).
func checkSets(t *testing.T, c config.Config, o Options, rs Table) {
	want := map[string][]netip.Prefix{}
	for _, p := range c.MasqueradeCIDRs {
		p = unmapped(p).Masked()
		name := SetMasqV4
		if p.Addr().Is6() {
			name = SetMasqV6
		}
		want[name] = append(want[name], p)
	}
	for _, p := range c.NonMasqueradeCIDRs {
		p = unmapped(p).Masked()
		name := SetNonMasqV4
		if p.Addr().Is6() {
			name = SetNonMasqV6
		}
		want[name] = append(want[name], p)
	}
	if !c.MasqLinkLocal {
		want[SetNonMasqV4] = append(want[SetNonMasqV4], config.LinkLocalIPv4)
	}
	if !c.MasqLinkLocalIPv6 {
		want[SetNonMasqV6] = append(want[SetNonMasqV6], config.LinkLocalIPv6)
	}
	if !o.EnableIPv6 {
		delete(want, SetMasqV6)
		delete(want, SetNonMasqV6)
	}
	if len(rs.Sets) != 4 {
		t.Fatalf("%d sets, want 4", len(rs.Sets))
	}
	for _, s := range rs.Sets {
		// One range per listed prefix not inside another (adjacent ones
		// apart: paint says why), sorted, not overlapping (the kernel
		// would refuse the batch), of the set's family.
		for i, r := range s.Elements {
			if r.From().Is4() != (s.Key == KeyIPv4) || r.From().Is4In6() || !r.IsValid() {
				t.Fatalf("set %s: %s is not a range of key %s", s.Name, rangeString(r), s.Key)
			}
			if i > 0 {
				prev := s.Elements[i-1]
				if compareRange(prev, r) >= 0 {
					t.Fatalf("set %s: %s before %s: not sorted", s.Name, rangeString(prev), rangeString(r))
				}
				if prev.Overlaps(r) {
					t.Fatalf("set %s: %s and %s overlap (the kernel would refuse the batch)", s.Name, rangeString(prev), rangeString(r))
				}
			}
		}
		if got, want := fmt.Sprint(s.Elements), fmt.Sprint(prefixRanges(want[s.Name])); got != want {
			t.Fatalf("set %s holds %s, want one range per listed prefix not inside another %s", s.Name, got, want)
		}
	}
}

// checkMasqChain checks the masquerade chain: an unconditional masquerade
// last, and with --to-ports, per protocol, ranges chosen in proportion to
// their sizes (P(range i) = Below_i/Of_i of what the earlier ranges left:
// Of must be what is left and Below the range's size).
func checkMasqChain(t *testing.T, o Options, rs Table) {
	masq := rs.Chain(MasqChainName).Rules
	last := masq[len(masq)-1]
	if last.Verdict != Masquerade || last.L4Proto != 0 || last.Ports != nil || last.Share != nil || last.FullyRandom != o.RandomFully {
		t.Fatalf("last masquerade rule %q: want an unconditional masquerade", RenderRule(last))
	}
	if want := 3*len(o.ToPorts) + 1; len(masq) != want {
		t.Fatalf("%d masquerade rules, want %d", len(masq), want)
	}
	total := uint32(0)
	for _, p := range o.ToPorts {
		total += p.size()
	}
	for proto := 0; proto < 3; proto++ {
		left := total
		for i, p := range o.ToPorts {
			r := masq[proto*len(o.ToPorts)+i]
			if r.Ports == nil || *r.Ports != p || r.FullyRandom != o.RandomFully {
				t.Fatalf("rule %q: want ports %s", RenderRule(r), p)
			}
			switch {
			case i == len(o.ToPorts)-1 && r.Share != nil:
				t.Fatalf("rule %q: the last range takes what is left, without numgen", RenderRule(r))
			case i < len(o.ToPorts)-1 && (r.Share == nil || r.Share.Below != p.size() || r.Share.Of != left):
				t.Fatalf("rule %q: want numgen random mod %d < %d", RenderRule(r), left, p.size())
			}
			left -= p.size()
		}
	}
}

// probeAddrs returns addresses to check: the edges of every prefix of the
// config and of link-local (first, last, one before, one after), the ends
// of the address spaces, IPv4-mapped IPv6 forms of IPv4 edges (which are
// IPv6 destinations), and pseudo-random addresses near and far.
func probeAddrs(c config.Config, rng *rand.Rand) []netip.Addr {
	var out []netip.Addr
	add := func(a netip.Addr) {
		if a.IsValid() {
			out = append(out, a)
			if a.Is4() {
				out = append(out, netip.AddrFrom16(a.As16()))
			}
		}
	}
	edges := func(p netip.Prefix) {
		for _, q := range []netip.Prefix{p, unmapped(p)} {
			first, last := q.Masked().Addr(), netipx.PrefixLastIP(q.Masked())
			add(first)
			add(last)
			add(first.Prev())
			add(last.Next())
		}
	}
	for _, p := range append(append([]netip.Prefix{config.LinkLocalIPv4, config.LinkLocalIPv6}, c.MasqueradeCIDRs...), c.NonMasqueradeCIDRs...) {
		edges(p)
	}
	for _, s := range []string{"0.0.0.0", "255.255.255.255", "::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "10.0.0.1", "fe80::1"} {
		add(netip.MustParseAddr(s))
	}
	for range 64 {
		var b [16]byte
		binary.BigEndian.PutUint64(b[:8], rng.Uint64())
		binary.BigEndian.PutUint64(b[8:], rng.Uint64())
		add(netip.AddrFrom4([4]byte(b[:4])))
		add(netip.AddrFrom16(b))
		if n := len(out); n > 0 {
			// Near an address already probed: flip one low bit.
			a := out[rng.IntN(n)].As16()
			a[15] ^= 1 << rng.IntN(8)
			add(netip.AddrFrom16(a).Unmap())
		}
	}
	return out
}

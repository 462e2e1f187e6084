package nft

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
)

// wanted returns Build's table for a config as Ensure wants it with
// ownership: owned by the agent and persistent.
func wanted(t testing.TB, yaml string, o Options) Table {
	t.Helper()
	cfg, _, err := config.Parse([]byte(yaml), config.Flags{EnableIPv6: o.EnableIPv6})
	if err != nil {
		t.Fatal(err)
	}
	w := Build(cfg, o)
	w.Owner, w.Persist = OwnedByUs, true
	return w
}

var planOpts = Options{Chain: DefaultChain, EnableIPv6: true, RandomFully: true}

func ipRange(from, to string) Range {
	return RangeFrom(netip.MustParseAddr(from), netip.MustParseAddr(to))
}

// foreignRule is a rule the agent cannot have written, as Read decodes it:
// a lookup of set (if not "") and a jump to chain (if not "").
func foreignRule(set, chain string) Rule {
	exprs := []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Register: 1, Data: []byte{unix.NFPROTO_IPV4}}}
	if set != "" {
		exprs = append(exprs, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Lookup{SourceRegister: 1, SetName: set, Invert: true})
	}
	v := &expr.Verdict{Kind: expr.VerdictAccept}
	if chain != "" {
		v = &expr.Verdict{Kind: expr.VerdictJump, Chain: chain}
	}
	return FoundRule(append(exprs, v), "")
}

func opStrings(p Plan) []string {
	var out []string
	for _, op := range p.Ops {
		out = append(out, op.String())
	}
	return out
}

func TestPlanFor(t *testing.T) {
	want := wanted(t, "nonMasqueradeCIDRs: [10.0.0.0/8, \"fd00::/8\"]\nmasqueradeCIDRs: [10.10.10.10/32]\n", planOpts)
	found := func(change func(f *Table)) *Table {
		f := want.Clone()
		change(f)
		return f
	}
	const tbl = "inet " + TableName + " "
	for _, tc := range []struct {
		name  string
		found *Table
		want  Table // zero: want
		err   error
		// ops are the plan's operations, one a line; a line ending in
		// "..." matches any operation that starts with the rest. With
		// some, only those are checked, in order, among the others.
		ops      []string
		some     bool
		recreate bool
	}{
		{name: "no table: created, exclusively", found: nil,
			ops: []string{"create table " + tbl + "{ flags owner, persist }", "add set ...", "add element " + tbl + "masq-v4 { 10.10.10.10 }",
				"add set ...", "add element " + tbl + "nonmasq-v4 { 10.0.0.0/8, 169.254.0.0/16 }", "add set ...", "add set ...",
				"add element " + tbl + "nonmasq-v6 { fd00::/8, fe80::/10 }",
				"add chain " + tbl + "postrouting { type nat hook postrouting priority srcnat + 10; policy accept; }",
				"add chain " + tbl + "IP-MASQ-AGENT", "add chain " + tbl + "masq-to-node",
				"add rule " + tbl + "postrouting ...", "add rule ...", "add rule ...", "add rule ...", "add rule ...", "add rule ...", "add rule ...",
				"add rule " + tbl + "masq-to-node ..."}},
		{name: "equal: nothing", found: want.Clone(), ops: nil},
		{name: "equal, counters aside: nothing", found: found(func(f *Table) { f.Chains[0].Rules[0].Packets = 7 }), ops: nil},
		{name: "elements added and removed: only element operations", found: found(func(f *Table) {
			s := f.Set(SetNonMasqV4)
			s.Elements = []Range{ipRange("10.0.0.0", "10.0.0.9"), RangeOfPrefix(netip.MustParsePrefix("169.254.0.0/16")),
				ipRange("192.168.0.1", "192.168.0.1")}
			f.Set(SetMasqV6).Elements = []Range{ipRange("2001:db8::", "2001:db8::ff")}
		}), ops: []string{
			"delete element " + tbl + "nonmasq-v4 { 10.0.0.0-10.0.0.9, 192.168.0.1 }",
			"add element " + tbl + "nonmasq-v4 { 10.0.0.0/8 }",
			"delete element " + tbl + "masq-v6 { 2001:db8::/120 }",
		}},
		{name: "a rule changed: that chain flushed and refilled", found: found(func(f *Table) {
			f.Chain(DefaultChain).Rules[1].Comment = "changed"
		}), ops: []string{"flush chain " + tbl + "IP-MASQ-AGENT", "add rule " + tbl + "IP-MASQ-AGENT ...", "add rule ...", "add rule ...",
			"add rule ...", "add rule ...", "add rule " + tbl + "IP-MASQ-AGENT ..."}},
		{name: "a foreign rule inserted", found: found(func(f *Table) {
			c := f.Chain(BaseChainName)
			c.Rules = append([]Rule{foreignRule("", "")}, c.Rules...)
		}), ops: []string{"flush chain " + tbl + "postrouting", "add rule " + tbl + "postrouting ..."}},
		{name: "foreign set, chain and object: deleted, chains flushed first", found: found(func(f *Table) {
			f.Sets = append(f.Sets, Set{Name: "extra", Key: KeyIPv4})
			f.Chains = append(f.Chains, Chain{Name: "intruder", Rules: []Rule{foreignRule("extra", DefaultChain)}},
				Chain{Name: "hooked", Hook: &Hook{Type: "filter", Hook: "output", Priority: 0, Policy: "drop"}})
			f.Objects = []Object{{Kind: "counter", Type: 1, Name: "c"}, {Kind: "flowtable", Name: "ft"}}
		}), ops: []string{"flush chain " + tbl + "intruder", "flush chain " + tbl + "hooked", "delete chain " + tbl + "intruder",
			"delete chain " + tbl + "hooked", "delete set " + tbl + "extra", "delete counter " + tbl + "c", "delete flowtable " + tbl + "ft"}},
		{name: "an odd set: replaced with its elements, its users flushed and refilled", found: found(func(f *Table) {
			f.Set(SetNonMasqV4).Odd = "a map"
		}), ops: []string{"flush chain " + tbl + "IP-MASQ-AGENT", "delete set " + tbl + "nonmasq-v4", "add set " + tbl + "nonmasq-v4 ...",
			"add element " + tbl + "nonmasq-v4 { 10.0.0.0/8, 169.254.0.0/16 }", "add rule " + tbl + "IP-MASQ-AGENT ...", "add rule ...",
			"add rule ...", "add rule ...", "add rule ...", "add rule ..."}},
		{name: "a set of the wrong family: replaced", found: found(func(f *Table) {
			s := f.Set(SetMasqV4)
			s.Key, s.Elements = KeyIPv6, nil
		}), some: true, ops: []string{"flush chain " + tbl + "IP-MASQ-AGENT", "delete set " + tbl + "masq-v4",
			"add set " + tbl + "masq-v4 { type ipv4_addr; ...", "add element " + tbl + "masq-v4 { 10.10.10.10 }", "add rule " + tbl + "IP-MASQ-AGENT ..."}},
		{name: "a foreign rule elsewhere that looks up a replaced set: flushed too", found: found(func(f *Table) {
			f.Set(SetNonMasqV6).Odd = "a timeout"
			f.Chains = append(f.Chains, Chain{Name: "intruder", Rules: []Rule{foreignRule(SetNonMasqV6, "")}})
		}), some: true, ops: []string{"flush chain " + tbl + "IP-MASQ-AGENT", "flush chain " + tbl + "intruder",
			"delete chain " + tbl + "intruder", "delete set " + tbl + "nonmasq-v6"}},
		{name: "base chain with the wrong hook: replaced", found: found(func(f *Table) {
			f.Chains[0].Hook = &Hook{Type: "filter", Hook: "postrouting", Priority: 0, Policy: "accept"}
		}), ops: []string{"flush chain " + tbl + "postrouting", "delete chain " + tbl + "postrouting",
			"add chain " + tbl + "postrouting { type nat hook postrouting priority srcnat + 10; policy accept; }", "add rule " + tbl + "postrouting ..."}},
		{name: "base chain with the wrong priority: replaced", found: found(func(f *Table) {
			f.Chains[0].Hook = &Hook{Type: "nat", Hook: "postrouting", Priority: 90, Policy: "accept"}
		}), some: true, ops: []string{"delete chain " + tbl + "postrouting", "add chain " + tbl + "postrouting { type nat hook postrouting priority srcnat + 10; policy accept; }"}},
		{name: "the decision chain made a base chain: replaced, the jump to it redone", found: found(func(f *Table) {
			f.Chain(DefaultChain).Hook = &Hook{Type: "nat", Hook: "postrouting", Priority: 100, Policy: "accept"}
		}), some: true, ops: []string{"flush chain " + tbl + "postrouting", "flush chain " + tbl + "IP-MASQ-AGENT",
			"delete chain " + tbl + "IP-MASQ-AGENT", "add chain " + tbl + "IP-MASQ-AGENT", "add rule " + tbl + "postrouting ..."}},
		{name: "a chain missing", found: found(func(f *Table) {
			f.Chains = slices.DeleteFunc(f.Chains, func(c Chain) bool { return c.Name == MasqChainName })
			f.Chain(DefaultChain).Rules = nil
		}), some: true, ops: []string{"add chain " + tbl + "masq-to-node", "add rule " + tbl + "IP-MASQ-AGENT ...", "add rule " + tbl + "masq-to-node ..."}},
		{name: "dormant: switched on", found: found(func(f *Table) { f.Dormant = true }),
			ops: []string{"update table " + tbl + "{ flags owner, persist }"}},
		{name: "orphaned: adopted", found: found(func(f *Table) { f.Owner = NotOwned }),
			ops: []string{"update table " + tbl + "{ flags owner, persist }"}},
		{name: "unowned, not persistent: re-created", found: found(func(f *Table) { f.Owner, f.Persist = NotOwned, false }),
			recreate: true, some: true, ops: []string{"delete table " + tbl[:len(tbl)-1], "create table " + tbl + "{ flags owner, persist }"}},
		{name: "owned, ownership not wanted: dropped", found: want.Clone(), want: func() Table { w := *want.Clone(); w.Owner, w.Persist = NotOwned, false; return w }(),
			ops: []string{"update table " + tbl[:len(tbl)-1] + "..."}}, // see TestOpStringNoFlags
		{name: "owned by another process", found: found(func(f *Table) { f.Owner = OwnedByOther }), err: ErrOwnedByOther},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := want
			if tc.want.Chains != nil {
				w = tc.want
			}
			p, err := PlanFor(tc.found, w)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("err %v, want %v", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := opStrings(p)
			if !matchOps(got, tc.ops, tc.some) {
				t.Errorf("plan:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.ops, "\n"))
			}
			if p.Recreate != tc.recreate {
				t.Errorf("Recreate %v, want %v (%s)", p.Recreate, tc.recreate, p.Why)
			}
			if tc.recreate && p.Why == "" {
				t.Error("a plan that re-creates says not why")
			}
			res, err := ExecPlan(tc.found, p)
			if err != nil {
				t.Fatalf("the plan fails: %v", err)
			}
			if !w.Equal(*res) {
				t.Errorf("the plan does not make the wanted table:\n%s", Render(*res))
			}
			// Planning again from the result: nothing left to do.
			if p, err := PlanFor(res, w); err != nil || !p.Empty() {
				t.Errorf("a second plan: %v\n%s", err, p)
			}
		})
	}
}

// matchOps compares operations with patterns (see TestPlanFor): all of
// them in order, or (some) the patterns as a subsequence.
func matchOps(got, pats []string, some bool) bool {
	match := func(op, pat string) bool {
		if prefix, ok := strings.CutSuffix(pat, "..."); ok {
			return strings.HasPrefix(op, prefix)
		}
		return op == pat
	}
	if !some {
		if len(got) != len(pats) {
			return false
		}
		for i := range pats {
			if !match(got[i], pats[i]) {
				return false
			}
		}
		return true
	}
	i := 0
	for _, op := range got {
		if i < len(pats) && match(op, pats[i]) {
			i++
		}
	}
	return i == len(pats)
}

func TestRecreate(t *testing.T) {
	want := wanted(t, "", planOpts)
	p := Recreate(nil, want, "why")
	if p.Recreate || p.Ops[0].Verb != Add || !p.Ops[0].Exclusive {
		t.Errorf("Recreate of nothing: %+v", p.Ops[0])
	}
	found := want.Clone()
	found.Chains = append(found.Chains, Chain{Name: "intruder", Rules: []Rule{foreignRule(SetNonMasqV4, DefaultChain)}})
	p = Recreate(found, want, "why")
	if !p.Recreate || p.Why != "why" || p.Ops[0].String() != "delete table inet "+TableName {
		t.Errorf("Recreate: %v %q\n%s", p.Recreate, p.Why, p)
	}
	if res, err := ExecPlan(found, p); err != nil || !want.Equal(*res) {
		t.Errorf("Recreate does not make the wanted table: %v", err)
	}
}

// Exec refuses what the kernel refuses; ExecPlan is all or nothing.
func TestExecRefusals(t *testing.T) {
	want := wanted(t, "", planOpts)
	for _, tc := range []struct {
		name string
		tbl  *Table
		op   Op
		err  error
	}{
		{"delete no table", nil, Op{Verb: Delete, Kind: KindTable}, syscall.ENOENT},
		{"update no table", nil, Op{Verb: Update, Kind: KindTable}, syscall.ENOENT},
		{"create an existing table", want.Clone(), Op{Verb: Add, Kind: KindTable, Exclusive: true}, syscall.EEXIST},
		{"a set in no table", nil, Op{Verb: Add, Kind: KindSet, Name: "s", Set: &Set{Name: "s"}}, syscall.ENOENT},
		{"add an existing set", want.Clone(), Op{Verb: Add, Kind: KindSet, Name: SetMasqV4, Set: &Set{Name: SetMasqV4}}, syscall.EEXIST},
		{"delete a missing set", want.Clone(), Op{Verb: Delete, Kind: KindSet, Name: "s"}, syscall.ENOENT},
		{"delete a set in use", want.Clone(), Op{Verb: Delete, Kind: KindSet, Name: SetMasqV4}, syscall.EBUSY},
		{"add an existing chain", want.Clone(), Op{Verb: Add, Kind: KindChain, Name: MasqChainName, Chain: &Chain{Name: MasqChainName}}, syscall.EEXIST},
		{"flush a missing chain", want.Clone(), Op{Verb: Flush, Kind: KindChain, Name: "c"}, syscall.ENOENT},
		{"delete a chain in use", want.Clone(), Op{Verb: Delete, Kind: KindChain, Name: MasqChainName}, syscall.EBUSY},
		{"a rule in a missing chain", want.Clone(), Op{Verb: Add, Kind: KindRule, Name: "c", Rule: &Rule{Verdict: Return}}, syscall.ENOENT},
		{"a rule that looks up a missing set", want.Clone(), Op{Verb: Add, Kind: KindRule, Name: MasqChainName,
			Rule: &Rule{Family: 4, Selector: SelDaddr, Set: "nope", Verdict: Return}}, syscall.ENOENT},
		{"elements of a missing set", want.Clone(), Op{Verb: Add, Kind: KindElements, Name: "s"}, syscall.ENOENT},
		{"delete a missing element", want.Clone(), Op{Verb: Delete, Kind: KindElements, Name: SetMasqV4,
			Elements: []Range{ipRange("1.1.1.1", "1.1.1.1")}}, syscall.ENOENT},
		{"an overlapping element", want.Clone(), Op{Verb: Add, Kind: KindElements, Name: SetNonMasqV4,
			Elements: []Range{ipRange("9.0.0.0", "10.0.0.0")}}, syscall.EEXIST},
		{"an overlapping element, after", want.Clone(), Op{Verb: Add, Kind: KindElements, Name: SetNonMasqV4,
			Elements: []Range{ipRange("10.255.255.255", "11.0.0.0")}}, syscall.EEXIST},
		{"delete a missing object", want.Clone(), Op{Verb: Delete, Kind: KindObject, Object: &Object{Kind: "quota", Name: "q"}}, syscall.ENOENT},
	} {
		before := tc.tbl.Clone()
		res, err := ExecPlan(tc.tbl, Plan{Ops: []Op{{Verb: Flush, Kind: KindChain, Name: MasqChainName}, tc.op}})
		if tc.tbl == nil {
			_, err = ExecPlan(tc.tbl, Plan{Ops: []Op{tc.op}})
		}
		if !errors.Is(err, tc.err) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.err)
		}
		if res != tc.tbl || (before != nil && !before.Equal(*tc.tbl)) {
			t.Errorf("%s: a refused plan changed the table", tc.name)
		}
	}
}

// TestPlanProperty: for random found and wanted tables, the plan executed
// on the found one makes the wanted one, and planning again then sends
// nothing.
func TestPlanProperty(t *testing.T) {
	const pairs = 600
	rng := rand.New(rand.NewPCG(11, 2024))
	kinds := map[string]int{}
	for i := range pairs {
		want := randomTable(rng)
		var found *Table
		var what []string
		if rng.IntN(12) > 0 {
			f := randomTable(rng)
			if rng.IntN(3) == 0 {
				f = want // tampered only
			}
			found, what = tamper(rng, f.Clone())
		} else {
			what = []string{"no table"}
		}
		for _, w := range what {
			kinds[w]++
		}
		p, err := PlanFor(found, want)
		if err != nil {
			t.Fatalf("pair %d (%s): %v", i, strings.Join(what, ", "), err)
		}
		res, err := ExecPlan(found, p)
		if err != nil {
			t.Fatalf("pair %d (%s): the plan fails: %v\nfound:\n%s\nplan:\n%s", i, strings.Join(what, ", "), err, renderOrNil(found), p)
		}
		if res == nil || !want.Equal(*res) {
			t.Fatalf("pair %d (%s): the plan does not make the wanted table\nfound:\n%s\nwant:\n%s\nplan:\n%s\nresult:\n%s",
				i, strings.Join(what, ", "), renderOrNil(found), Render(want), p, renderOrNil(res))
		}
		if p2, err := PlanFor(res, want); err != nil || !p2.Empty() {
			t.Fatalf("pair %d (%s): a second plan is not empty: %v\n%s", i, strings.Join(what, ", "), err, p2)
		}
		// A plan that re-creates is only made when in place cannot do.
		if p.Recreate && !(found.Owner == NotOwned && !found.Persist && want.Owner == OwnedByUs) {
			t.Fatalf("pair %d (%s): re-created: %s", i, strings.Join(what, ", "), p.Why)
		}
		// The plan prints.
		if found != nil && strings.Count(p.String(), "\n") != len(p.Ops) {
			t.Fatalf("pair %d: the plan does not print one operation a line:\n%s", i, p)
		}
	}
	t.Logf("%d pairs; tampering: %v", pairs, kinds)
}

func renderOrNil(t *Table) string {
	if t == nil {
		return "(no table)"
	}
	return Render(*t)
}

// randomTable builds a table from a random config and random options,
// owned or not.
func randomTable(rng *rand.Rand) Table {
	cfg := config.Config{ResyncInterval: time.Minute, CIDRLimit: 1 << 20,
		MasqLinkLocal: rng.IntN(2) == 0, MasqLinkLocalIPv6: rng.IntN(2) == 0,
		MasqOutBound: rng.IntN(2) == 0, MasqOutBoundIPv6: rng.IntN(2) == 0}
	for range rng.IntN(12) {
		cfg.NonMasqueradeCIDRs = append(cfg.NonMasqueradeCIDRs, randomPrefix(rng))
	}
	for range rng.IntN(4) {
		cfg.MasqueradeCIDRs = append(cfg.MasqueradeCIDRs, randomPrefix(rng))
	}
	o := Options{Chain: DefaultChain, EnableIPv6: rng.IntN(2) == 0, RandomFully: rng.IntN(2) == 0}
	if rng.IntN(4) == 0 {
		o.Chain = "MY-CHAIN"
	}
	switch rng.IntN(3) {
	case 0:
		o.ToPorts = []PortRange{{1024, 29999}, {32768, 65535}}
	case 1:
		o.ToPorts = []PortRange{{uint16(1 + rng.IntN(1000)), 60000}}
	}
	t := Build(cfg, o)
	if rng.IntN(3) > 0 {
		t.Owner, t.Persist = OwnedByUs, true
	}
	return t
}

// randomPrefix picks from a small space, so that prefixes of different
// tables overlap, nest and touch.
func randomPrefix(rng *rand.Rand) netip.Prefix {
	if rng.IntN(3) == 0 {
		a := netip.AddrFrom16([16]byte{0xfd, byte(rng.IntN(4)), 0, byte(rng.IntN(4)), 15: byte(rng.IntN(256))})
		return netip.PrefixFrom(a, []int{0, 8, 16, 32, 64, 120, 128}[rng.IntN(7)]).Masked()
	}
	a := netip.AddrFrom4([4]byte{byte(8 + rng.IntN(4)), byte(rng.IntN(4)), 0, byte(rng.IntN(256))})
	return netip.PrefixFrom(a, []int{0, 4, 8, 14, 16, 24, 30, 32}[rng.IntN(8)]).Masked()
}

// tamper changes a table as another process might: a few random changes.
func tamper(rng *rand.Rand, t *Table) (*Table, []string) {
	var what []string
	for range 1 + rng.IntN(4) {
		switch k := rng.IntN(16); k {
		case 0, 1: // elements added, prefixes or not
			s := &t.Sets[rng.IntN(len(t.Sets))]
			for range 1 + rng.IntN(4) {
				r := randomRange(rng, s.Key.Family())
				i, _ := slices.BinarySearchFunc(s.Elements, r, compareRange)
				if (i > 0 && s.Elements[i-1].To().Compare(r.From()) >= 0) || (i < len(s.Elements) && s.Elements[i].From().Compare(r.To()) <= 0) {
					continue // the kernel holds disjoint ranges
				}
				s.Elements = slices.Insert(s.Elements, i, r)
			}
			what = append(what, "elements added")
		case 2: // elements removed
			s := &t.Sets[rng.IntN(len(t.Sets))]
			if len(s.Elements) > 0 {
				i := rng.IntN(len(s.Elements))
				s.Elements = slices.Delete(s.Elements, i, i+1)
			}
			what = append(what, "elements removed")
		case 3: // a foreign rule inserted in one of the agent's chains
			c := &t.Chains[rng.IntN(len(t.Chains))]
			set, target := "", ""
			if rng.IntN(2) == 0 {
				set = t.Sets[rng.IntN(len(t.Sets))].Name
			}
			if rng.IntN(2) == 0 && c.Name != MasqChainName {
				target = MasqChainName
			}
			c.Rules = slices.Insert(c.Rules, rng.IntN(len(c.Rules)+1), foreignRule(set, target))
			what = append(what, "foreign rule")
		case 4: // a foreign chain, perhaps jumped to, perhaps using the agent's objects
			name := fmt.Sprintf("intruder%d", rng.IntN(3))
			if t.Chain(name) != nil {
				continue
			}
			c := Chain{Name: name}
			if rng.IntN(2) == 0 {
				c.Hook = &Hook{Type: "filter", Hook: "output", Priority: rng.IntN(10), Policy: "accept"}
			}
			if rng.IntN(2) == 0 {
				c.Rules = append(c.Rules, foreignRule(t.Sets[rng.IntN(len(t.Sets))].Name, t.Chains[1+rng.IntN(len(t.Chains)-1)].Name))
			}
			t.Chains = append(t.Chains, c)
			if rng.IntN(2) == 0 {
				from := &t.Chains[rng.IntN(len(t.Chains)-1)]
				from.Rules = append(from.Rules, foreignRule("", name))
			}
			what = append(what, "foreign chain")
		case 5: // a foreign set, perhaps looked up
			name := fmt.Sprintf("extra%d", rng.IntN(3))
			if t.Set(name) != nil {
				continue
			}
			t.Sets = append(t.Sets, Set{Name: name, Key: KeyIPv4, Elements: []Range{randomRange(rng, 4)}})
			if rng.IntN(2) == 0 {
				c := &t.Chains[rng.IntN(len(t.Chains))]
				c.Rules = append(c.Rules, foreignRule(name, ""))
			}
			what = append(what, "foreign set")
		case 6: // a foreign object
			t.Objects = append(t.Objects, []Object{{Kind: "counter", Type: 1, Name: fmt.Sprintf("c%d", len(t.Objects))},
				{Kind: "flowtable", Name: fmt.Sprintf("f%d", len(t.Objects))}}[rng.IntN(2)])
			what = append(what, "foreign object")
		case 7: // an odd set
			t.Sets[rng.IntN(len(t.Sets))].Odd = []string{"a map", "a timeout", "size 64", "set expressions"}[rng.IntN(4)]
			what = append(what, "odd set")
		case 8: // a set of the other family
			s := &t.Sets[rng.IntN(len(t.Sets))]
			s.Key, s.Elements = addrKey(10-s.Key.Family()), nil
			what = append(what, "set family")
		case 9: // a hook changed, added or removed
			c := &t.Chains[rng.IntN(len(t.Chains))]
			switch {
			case c.Hook == nil:
				c.Hook = &Hook{Type: "nat", Hook: "postrouting", Priority: 100, Policy: "accept"}
			case rng.IntN(2) == 0:
				c.Hook = nil
			default:
				h := *c.Hook
				h.Priority, h.Policy = rng.IntN(300)-150, []string{"accept", "drop"}[rng.IntN(2)]
				c.Hook = &h
			}
			what = append(what, "hook")
		case 10: // an odd chain
			t.Chains[rng.IntN(len(t.Chains))].Odd = "flags 0x1"
			what = append(what, "odd chain")
		case 11: // dormant
			t.Dormant = true
			what = append(what, "dormant")
		case 12: // ownership: orphaned, unowned, or owned
			switch rng.IntN(3) {
			case 0:
				t.Owner, t.Persist = NotOwned, true
			case 1:
				t.Owner, t.Persist = NotOwned, false
			default:
				t.Owner, t.Persist = OwnedByUs, true
			}
			what = append(what, "ownership")
		case 13: // a chain missing, with the rules that jump to it
			i := rng.IntN(len(t.Chains))
			name := t.Chains[i].Name
			t.Chains = slices.Delete(t.Chains, i, i+1)
			for j := range t.Chains {
				t.Chains[j].Rules = slices.DeleteFunc(t.Chains[j].Rules, func(r Rule) bool { return r.target() == name })
			}
			what = append(what, "chain missing")
		case 14: // a set missing, with the rules that look it up
			i := rng.IntN(len(t.Sets))
			name := t.Sets[i].Name
			t.Sets = slices.Delete(t.Sets, i, i+1)
			for j := range t.Chains {
				t.Chains[j].Rules = slices.DeleteFunc(t.Chains[j].Rules, func(r Rule) bool { return r.Set == name || usesSet(r, name) })
			}
			what = append(what, "set missing")
		case 15: // rules reordered or dropped
			c := &t.Chains[rng.IntN(len(t.Chains))]
			if len(c.Rules) > 1 {
				rng.Shuffle(len(c.Rules), func(i, j int) { c.Rules[i], c.Rules[j] = c.Rules[j], c.Rules[i] })
				c.Rules = c.Rules[:len(c.Rules)-rng.IntN(2)]
			}
			what = append(what, "rules reordered")
		}
		if len(t.Sets) == 0 || len(t.Chains) < 2 {
			break
		}
	}
	return t, what
}

func usesSet(r Rule, name string) bool {
	for _, e := range r.expressions() {
		if referenced(e) == name {
			return true
		}
	}
	return false
}

// randomRange returns a range of a family that is often not a prefix.
func randomRange(rng *rand.Rand, f Family) Range {
	if f == 6 {
		from := netip.AddrFrom16([16]byte{0xfd, byte(rng.IntN(4)), 15: byte(rng.IntN(200))})
		to := from
		for range rng.IntN(40) {
			to = to.Next()
		}
		return RangeFrom(from, to)
	}
	from := netip.AddrFrom4([4]byte{byte(8 + rng.IntN(4)), byte(rng.IntN(4)), 0, byte(rng.IntN(200))})
	to := from
	for range rng.IntN(40) {
		to = to.Next()
	}
	return RangeFrom(from, to)
}

// staleOnce is a Kernel that lets another process change the table
// between the first Read and the first Send.
type staleOnce struct {
	*Fake
	change func(t **Table)
	done   bool
}

func (k *staleOnce) Send(p Plan, gen uint32) (Sent, error) {
	if !k.done {
		k.done = true
		k.Tamper("rival", k.change)
	}
	return k.Fake.Send(p, gen)
}

func TestEnsure(t *testing.T) {
	want := Build(config.Default(config.Flags{}), Options{Chain: DefaultChain, RandomFully: true})
	owned := *want.Clone()
	owned.Owner, owned.Persist = OwnedByUs, true
	ensure := func(t *testing.T, k Kernel, f *Fake, w Table) Result {
		t.Helper()
		res, err := Ensure(k, w)
		if err != nil {
			t.Fatalf("Ensure: %v", err)
		}
		got := f.Table()
		w.Owner, w.Persist = NotOwned, false
		if f.Owns() {
			w.Owner, w.Persist = OwnedByUs, true
		}
		if got == nil || !w.Equal(*got) {
			t.Fatalf("the fake holds:\n%s", renderOrNil(got))
		}
		return res
	}

	t.Run("created, then unchanged sends nothing", func(t *testing.T) {
		f := &Fake{}
		res := ensure(t, f, f, want)
		if !res.Created || res.Unchanged || res.Found != nil || res.Attempts != 1 || res.Messages == 0 {
			t.Errorf("first: %+v", res)
		}
		if got := f.Table(); got.Owner != OwnedByUs || !got.Persist {
			t.Errorf("not owned: %v %v", got.Owner, got.Persist)
		}
		res = ensure(t, f, f, want)
		if !res.Unchanged || res.Attempts != 0 || res.Messages != 0 || len(f.Sent()) != 1 {
			t.Errorf("second: %+v, %d plans sent", res, len(f.Sent()))
		}
	})

	t.Run("without ownership", func(t *testing.T) {
		f := &Fake{NoOwner: true}
		ensure(t, f, f, owned) // Ensure decides ownership, not the caller
		if got := f.Table(); got.Owner != NotOwned || got.Persist {
			t.Errorf("owned: %v %v", got.Owner, got.Persist)
		}
	})

	// A kernel before 6.9 refuses the owned create, each in its own words
	// (6.1: EOPNOTSUPP; 5.10: EINVAL, for any table flag but dormant): the
	// same Ensure creates the table without ownership, and from then on
	// the Kernel does not ask for it.
	for _, refusal := range []error{syscall.EOPNOTSUPP, syscall.EINVAL, syscall.EPERM} {
		t.Run("ownership refused with "+refusal.Error()+": created without", func(t *testing.T) {
			f := &Fake{OwnerRefusal: refusal}
			res := ensure(t, f, f, owned)
			if f.Owns() {
				t.Errorf("Owns() after the kernel refused ownership with %v", refusal)
			}
			if got := f.Table(); got.Owner != NotOwned || got.Persist {
				t.Errorf("created with owner %v persist %v", got.Owner, got.Persist)
			}
			if !res.Created || len(f.Sent()) != 1 {
				t.Errorf("%+v, %d plans applied", res, len(f.Sent()))
			}
			// Later syncs neither ask again nor recreate.
			f.Tamper("flush set", func(t **Table) { (*t).Set(SetNonMasqV4).Elements = nil })
			if res := ensure(t, f, f, owned); !res.Partial || res.Attempts != 1 {
				t.Errorf("repair: %+v", res)
			}
		})
	}

	t.Run("owned create refused with EEXIST (a table made since the read): ownership kept", func(t *testing.T) {
		f := &Fake{Refuse: func(op Op) error {
			if op.Kind == KindTable && op.Verb == Add {
				return syscall.EEXIST
			}
			return nil
		}}
		Ensure(f, owned)
		if !f.Owns() {
			t.Errorf("EEXIST on the exclusive create turned ownership off")
		}
	})

	t.Run("another message refused: ownership kept", func(t *testing.T) {
		f := &Fake{}
		f.Refuse = func(op Op) error {
			if op.Kind == KindSet {
				return syscall.EINVAL
			}
			return nil
		}
		if _, err := Ensure(f, owned); err == nil || errors.Is(err, ErrStale) {
			t.Errorf("err %v, want the refusal of the set", err)
		}
		if !f.Owns() {
			t.Errorf("the refusal of a set turned ownership off")
		}
	})

	t.Run("tampered: repaired in place and verified", func(t *testing.T) {
		f := &Fake{}
		ensure(t, f, f, want)
		f.Tamper("flush set", func(t **Table) { (*t).Set(SetNonMasqV4).Elements = nil })
		res := ensure(t, f, f, want)
		if !res.Partial || res.Recreated || res.Found == nil || len(res.Found.Set(SetNonMasqV4).Elements) != 0 {
			t.Errorf("%+v", res)
		}
		if ops := opStrings(res.Plan); len(ops) != 1 || !strings.HasPrefix(ops[0], "add element inet ip-masq-agent nonmasq-v4") {
			t.Errorf("plan %q", ops)
		}
	})

	t.Run("refused in place: re-created in the same Ensure", func(t *testing.T) {
		f := &Fake{}
		ensure(t, f, f, want)
		f.Tamper("map", func(t **Table) { (*t).Set(SetNonMasqV4).Odd = "a map" })
		f.Refuse = func(op Op) error {
			if op.Kind == KindSet && op.Verb == Delete {
				return syscall.EOPNOTSUPP
			}
			return nil
		}
		res := ensure(t, f, f, want)
		if !res.Recreated || res.Partial || res.Attempts != 2 || !res.Plan.Recreate || !strings.Contains(res.Plan.Why, "operation not supported") {
			t.Errorf("%+v", res)
		}
	})

	t.Run("undone after every commit: gives up naming the rival", func(t *testing.T) {
		f := &Fake{}
		ensure(t, f, f, want)
		undo := func(t **Table) { (*t).Set(SetNonMasqV4).Elements = nil }
		f.Tamper("flush set", undo)
		res, err := Ensure(rival{f, undo}, want)
		if err == nil || !strings.Contains(err.Error(), "another process changed it back after 5 of them") || res.Undone != MaxAttempts {
			t.Errorf("%+v, err %v", res, err)
		}
	})

	t.Run("refused even when re-created: an error naming both", func(t *testing.T) {
		f := &Fake{}
		ensure(t, f, f, want)
		f.Tamper("flush set", func(t **Table) { (*t).Set(SetNonMasqV4).Elements = nil })
		f.Refuse = func(op Op) error { return syscall.EINVAL }
		_, err := Ensure(f, want)
		if err == nil || !strings.Contains(err.Error(), "invalid argument (and before, in place: invalid argument)") {
			t.Errorf("err %v", err)
		}
	})

	t.Run("changed between read and send: planned again", func(t *testing.T) {
		f := &Fake{}
		ensure(t, f, f, want)
		f.Tamper("flush set", func(t **Table) { (*t).Set(SetNonMasqV4).Elements = nil })
		k := &staleOnce{Fake: f, change: func(t **Table) {
			(*t).Chains = append((*t).Chains, Chain{Name: "intruder"})
		}}
		res := ensure(t, k, f, want)
		if res.Attempts != 1 || res.Stale != 1 || !res.Partial || !strings.Contains(res.Plan.String(), "delete chain inet ip-masq-agent intruder") {
			t.Errorf("%+v\n%s", res, res.Plan)
		}
	})

	t.Run("a table created between read and send: not merged into", func(t *testing.T) {
		f := &Fake{}
		k := &staleOnce{Fake: f, change: func(t **Table) {
			*t = &Table{Chains: []Chain{{Name: BaseChainName, Hook: want.Chains[0].Hook, Rules: []Rule{foreignRule("", "")}}}}
		}}
		res := ensure(t, k, f, want)
		if res.Attempts != 1 || res.Stale != 1 || !res.Recreated || res.Found != nil {
			t.Errorf("%+v", res)
		}
		// Without the generation check, the exclusive create refuses.
		f2 := &Fake{}
		p, _ := PlanFor(nil, owned)
		f2.Tamper("rival", func(t **Table) { *t = &Table{} })
		if _, err := f2.Send(p, 0); !errors.Is(err, syscall.EEXIST) {
			t.Errorf("exclusive create over a table: %v", err)
		}
	})

	t.Run("changing all the time: gives up", func(t *testing.T) {
		f := &Fake{}
		k := &alwaysStale{Fake: f}
		// Bounded by the deadline, not by a number of tries: on a busy
		// node every plan may be refused for a while.
		res, err := EnsureBy(k, want, time.Now().Add(300*time.Millisecond))
		if err == nil || !errors.Is(err, ErrStale) || !strings.Contains(err.Error(), "gave up after") || res.Stale < 5 {
			t.Errorf("err %v, %d stale", err, res.Stale)
		}
	})

	t.Run("owned by another process", func(t *testing.T) {
		f := &Fake{}
		ensure(t, f, f, want)
		f.Tamper("owner", func(t **Table) { (*t).Owner = OwnedByOther; (*t).Set(SetNonMasqV4).Elements = nil })
		if _, err := Ensure(f, want); !errors.Is(err, ErrOwnedByOther) {
			t.Errorf("err %v", err)
		}
		n := len(f.Sent())
		// Orphaned when the owner exits: adopted without a rewrite.
		f.Tamper("owner exits", func(t **Table) { (*t).Owner, (*t).Persist = NotOwned, true })
		res := ensure(t, f, f, want)
		if ops := opStrings(res.Plan); len(f.Sent()) != n+1 || len(ops) != 2 || !strings.HasPrefix(ops[0], "update table") {
			t.Errorf("adopted with %q", ops)
		}
	})

	t.Run("read and send errors", func(t *testing.T) {
		f := &Fake{ReadErr: errors.New("read broke")}
		if _, err := Ensure(f, want); err == nil || err.Error() != "read broke" {
			t.Errorf("read: %v", err)
		}
		f = &Fake{SendErr: errors.New("send broke")}
		if _, err := Ensure(f, want); err == nil || !strings.Contains(err.Error(), "send broke") {
			t.Errorf("send: %v", err)
		}
	})
}

// alwaysStale is a Kernel where another process changes the table before
// every Send.
type alwaysStale struct{ *Fake }

func (k *alwaysStale) Send(p Plan, gen uint32) (Sent, error) {
	k.Tamper("rival", func(t **Table) { *t = nil })
	return k.Fake.Send(p, gen)
}

func TestOpStringNoFlags(t *testing.T) {
	for _, tc := range []struct {
		op   Op
		want string
	}{
		{Op{Verb: Update, Kind: KindTable}, "update table inet ip-masq-agent { }"},
		{Op{Verb: Add, Kind: KindTable, Exclusive: true}, "create table inet ip-masq-agent { }"},
		{Op{Verb: Add, Kind: KindTable, Owned: true, Persist: true}, "add table inet ip-masq-agent { flags owner, persist }"},
		{Op{Verb: Delete, Kind: KindTable}, "delete table inet ip-masq-agent"},
	} {
		if got := tc.op.String(); got != tc.want {
			t.Errorf("%q, want %q", got, tc.want)
		}
	}
}

// rival is a Fake whose every commit another process undoes at once.
type rival struct {
	*Fake
	undo func(**Table)
}

func (r rival) Send(p Plan, gen uint32) (Sent, error) {
	sent, err := r.Fake.Send(p, gen)
	if err == nil {
		r.Tamper("undo", r.undo)
	}
	return sent, err
}

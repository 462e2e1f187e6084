package nft

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
	"golang.org/x/sys/unix"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
)

// ExplainTable and Decide are one evaluator: where Decide says a table
// masquerades nothing (a dormant table, a base chain whose policy drops
// what no rule decided), ExplainTable says so too, and why.
func TestExplainTableAgreesWithDecide(t *testing.T) {
	want := Build(config.Default(config.Flags{}), Options{Chain: DefaultChain, RandomFully: true})
	ext := netip.MustParseAddr("203.0.113.10")
	for _, tc := range []struct {
		name   string
		change func(*Table)
		masq   bool
		reason string
	}{
		{"as built", func(*Table) {}, true, "chain IP-MASQ-AGENT rule 3"},
		{"dormant", func(t *Table) { t.Dormant = true }, false, "the table is dormant (flags dormant): it masquerades nothing"},
		{"jump deleted, policy drop", func(t *Table) {
			c := t.Chain(BaseChainName)
			h := *c.Hook
			h.Policy, c.Hook, c.Rules = "drop", &h, nil
		}, false, "dropped: no rule of chain postrouting decided, and its policy is drop"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			found := want.Clone()
			tc.change(found)
			masq, _ := found.Decide(Packet{Dst: ext})
			e := ExplainTable(found, Packet{Dst: ext}, nil)
			if e.Masquerade != masq || e.Masquerade != tc.masq || e.Undetermined || e.Reason != tc.reason {
				t.Errorf("ExplainTable: %s %q; Decide: masquerade %v; want %v %q", e.Verdict(), e.Reason, masq, tc.masq, tc.reason)
			}
		})
	}
}

// MatchExprs and RuleVerdict evaluate a rule of any table, as iptables-nft writes them
// (xtables matches and targets, prefixes as partial loads), on a
// destination and whether it is local.
func TestMatchExprs(t *testing.T) {
	jump := []expr.Any{ // -m addrtype ! --dst-type LOCAL -j IP-MASQ
		&expr.Match{Name: "addrtype", Rev: 1, Info: &xt.AddrTypeV1{Dest: uint16(xt.AddrTypeLocal), Flags: 0x2}},
		&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictJump, Chain: "IP-MASQ"},
	}
	ret := []expr.Any{ // -d 10.0.0.0/8 -j RETURN
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{10}},
		&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictReturn},
	}
	masq := []expr.Any{&expr.Counter{}, &expr.Target{Name: "MASQUERADE", Info: &xt.NatRange{}}}
	mark := []expr.Any{ // -m mark --mark 1 -j ACCEPT, as nft encodes it
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{1, 0, 0, 0}},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}
	snat := []expr.Any{&expr.Target{Name: "SNAT"}}
	ret6 := []expr.Any{ // ip6 daddr 2001:db8::/32 return, as nft encodes it
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 24, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0x20, 0x01, 0x0d, 0xb8}},
		&expr.Verdict{Kind: expr.VerdictReturn},
	}
	logged := []expr.Any{ // -d 10.0.0.0/8 -j RETURN with a log statement before it
		ret[0], ret[1], &expr.Log{Key: 1 << unix.NFTA_LOG_PREFIX, Data: []byte("x")}, ret[2], ret[3],
	}
	for _, tc := range []struct {
		name    string
		exprs   []expr.Any
		addr    string
		local   bool
		match   Match
		verdict string
	}{
		{"log statement, in", logged, "10.1.2.3", false, MatchYes, "return"},
		{"log statement, out", logged, "11.1.2.3", false, MatchNo, "return"},
		{"jump, remote", jump, "203.0.113.1", false, MatchYes, "jump IP-MASQ"},
		{"jump, local", jump, "203.0.113.1", true, MatchNo, "jump IP-MASQ"},
		{"prefix, in", ret, "10.1.2.3", false, MatchYes, "return"},
		{"prefix, mapped", ret, "::ffff:10.1.2.3", false, MatchYes, "return"},
		{"prefix, out", ret, "11.1.2.3", false, MatchNo, "return"},
		{"masquerade target", masq, "203.0.113.1", false, MatchYes, "masquerade"},
		{"packet mark", mark, "203.0.113.1", false, MatchUnknown, "accept"},
		{"IPv6 prefix, in", ret6, "2001:db8::1", false, MatchYes, "return"},
		{"IPv6 prefix, out", ret6, "2001:db9::1", false, MatchNo, "return"},
		{"other target", snat, "203.0.113.1", false, MatchYes, "-j SNAT"},
	} {
		m, v := MatchExprs(tc.exprs, Packet{Dst: netip.MustParseAddr(tc.addr)}, tc.local), RuleVerdict(tc.exprs)
		if m != tc.match || v != tc.verdict {
			t.Errorf("%s: MatchExprs, RuleVerdict = %d %q, want %d %q", tc.name, m, v, tc.match, tc.verdict)
		}
	}
}

// Rule.equal compares every field but the counter's values and the
// kernel's expressions: a field added to Rule is compared without a line
// of its own.
func TestRuleEqualEveryField(t *testing.T) {
	typ := reflect.TypeOf(Rule{})
	for i := range typ.NumField() {
		f := typ.Field(i)
		var a, b Rule
		v := reflect.ValueOf(&b).Elem().Field(i)
		if !v.CanSet() { // exprs
			continue
		}
		switch v.Kind() {
		case reflect.Bool:
			v.SetBool(true)
		case reflect.String:
			v.SetString("x")
		case reflect.Uint8, reflect.Uint64:
			v.SetUint(1)
		case reflect.Pointer:
			v.Set(reflect.New(f.Type.Elem()))
		default:
			t.Fatalf("field %s of kind %s: teach this test to set it", f.Name, v.Kind())
		}
		if counter := f.Name == "Packets" || f.Name == "Bytes"; a.equal(b) != counter {
			t.Errorf("a rule that differs in %s: equal %v", f.Name, a.equal(b))
		}
	}
}

// EvalChain takes one chain of another table on its own: the first rule
// that decides, a return or the chain's end passes, and a jump out of the
// chain, whose target it cannot see, is undetermined.
func TestEvalChain(t *testing.T) {
	daddr10 := []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 1},
		&expr.Cmp{Register: 1, Data: []byte{10}}}
	rule := func(exprs ...expr.Any) Rule { return FoundRule(exprs, "") }
	ret10 := rule(append(daddr10, &expr.Verdict{Kind: expr.VerdictReturn})...)
	jump10 := rule(append(daddr10, &expr.Verdict{Kind: expr.VerdictJump, Chain: "OTHER"})...)
	accept10 := rule(append(daddr10, &expr.Verdict{Kind: expr.VerdictAccept})...)
	masq := rule(&expr.Target{Name: "MASQUERADE"})
	in10, out := netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("203.0.113.10")
	for _, tc := range []struct {
		name  string
		rules []Rule
		addr  netip.Addr
		want  ChainVerdict
	}{
		{"masquerade", []Rule{ret10, masq}, out, ChainVerdict{Masquerade: true, Verdict: "masquerade", Rule: 2}},
		{"return", []Rule{ret10, masq}, in10, ChainVerdict{Passes: true, Verdict: "return", Rule: 1}},
		{"end", []Rule{ret10}, out, ChainVerdict{Passes: true}},
		{"accept", []Rule{accept10, masq}, in10, ChainVerdict{Verdict: "accept", Rule: 1}},
		{"jump", []Rule{jump10, masq}, in10, ChainVerdict{Undetermined: true, Verdict: "jump OTHER", Rule: 1, Why: "rule 1 of chain C: jump OTHER"}},
	} {
		if got := EvalChain("C", tc.rules, Packet{Dst: tc.addr}, false); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

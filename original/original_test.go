package original

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"

	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
)

// xtRules are rules as iptables-nft writes the original agent's: a prefix
// as a short payload load, comments and addrtype as xtables matches.
func originalForTest() Rules {
	comment := func(s string) *expr.Match { c := xt.Comment(s); return &expr.Match{Name: "comment", Info: &c} }
	ret := &expr.Verdict{Kind: expr.VerdictReturn}
	jump := newXTRule(3, []expr.Any{
		comment(JumpComment(nft.DefaultChain)),
		&expr.Match{Name: "addrtype", Rev: 1, Info: &xt.AddrTypeV1{Dest: uint16(xt.AddrTypeLocal), Flags: 0x2}},
		&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictJump, Chain: nft.DefaultChain},
	}, nil)
	accept := newXTRule(2, []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: []byte{255, 255, 240, 0}, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Register: 1, Data: []byte{192, 168, 0, 0}}, &expr.Counter{}, &expr.Verdict{Kind: expr.VerdictAccept},
	}, nil)
	fams := withJumps(4, "", []XTRule{accept, jump}, []Family{{
		Family: 4, Chain: nft.DefaultChain, ChainPresent: true, ChainHandle: 1,
		Rules: []XTRule{
			newXTRule(4, []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 1},
				&expr.Cmp{Register: 1, Data: []byte{10}}, comment("ip-masq-agent: local traffic is not subject to MASQUERADE"), &expr.Counter{}, ret}, nil),
			newXTRule(5, []expr.Any{comment("ip-masq-agent: outbound traffic is subject to MASQUERADE (must be last in chain)"),
				&expr.Counter{}, &expr.Target{Name: "MASQUERADE"}}, nil),
		},
	}}, nil)
	return Rules{Families: append(fams, withJumps(6, "", nil, nil, nil)...)}
}

// The jump's comment is recognised whatever chain it names, with the
// double quotes that Azure's ip-masq-agent-v2 leaves in it.
func TestOriginalJumpComment(t *testing.T) {
	for c, want := range map[string]string{
		JumpComment("IP-MASQ"):                                      "IP-MASQ",
		JumpComment("my-chain"):                                     "my-chain",
		`"` + JumpComment("X") + `"`:                                "X",
		"ip-masq-agent: local traffic is not subject to MASQUERADE": "",
		"ip-masq-agent: ensure nat POSTROUTING directs all non-LOCAL destination traffic to our custom  chain": "",
		"": "",
	} {
		if got, ok := isOriginalJumpComment(c); got != want || ok != (want != "") {
			t.Errorf("%q: %q %v, want %q", c, got, ok, want)
		}
	}
}

// Chains of any name behind a commented jump are found; two chains in one
// family are explained in the order of their jumps; a foreign chain of a
// well-known name is reported but not removable unless named.
func TestOriginalByIdentity(t *testing.T) {
	comment := func(s string) *expr.Match { c := xt.Comment(s); return &expr.Match{Name: "comment", Info: &c} }
	jump := func(h uint64, chain, cmt string) XTRule {
		return newXTRule(h, []expr.Any{comment(cmt), &expr.Counter{}, &expr.Verdict{Kind: expr.VerdictJump, Chain: chain}}, nil)
	}
	masq := newXTRule(20, []expr.Any{comment("ip-masq-agent: outbound traffic is subject to MASQUERADE (must be last in chain)"), &expr.Target{Name: "MASQUERADE"}}, nil)
	ret10 := newXTRule(21, []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 1},
		&expr.Cmp{Register: 1, Data: []byte{10}}, comment("ip-masq-agent: local traffic is not subject to MASQUERADE"), &expr.Verdict{Kind: expr.VerdictReturn}}, nil)
	post := []XTRule{
		jump(1, "custom-masq", `"`+JumpComment("custom-masq")+`"`),
		jump(2, AddonChain, JumpComment(nft.DefaultChain)), // a comment naming another chain
	}
	fams := withJumps(4, "", post, []Family{
		{Family: 4, Chain: AddonChain, ChainPresent: true, ChainHandle: 8, Rules: []XTRule{masq}},
		{Family: 4, Chain: "custom-masq", ChainPresent: true, ChainHandle: 9, Rules: []XTRule{ret10}},
		{Family: 4, Chain: nft.DefaultChain, ChainPresent: true, ChainHandle: 10, Rules: []XTRule{{Handle: 30, Verdict: "accept", Text: "accept"}}},
	}, nil)
	o := Rules{Families: append(fams, withJumps(6, "", nil, nil, nil)...)}
	if got := strings.Join(o.Chains(), ","); got != "IP-MASQ,custom-masq,IP-MASQ-AGENT" {
		t.Errorf("chains %s", got)
	}
	if f := o.Families[0]; f.CommentChain != nft.DefaultChain || len(f.Jumps) != 1 || f.Jumps[0].Handle != 2 {
		t.Errorf("IP-MASQ's entry: %+v", f)
	}
	if foreign := o.Foreign(); len(foreign) != 1 || foreign[0].Chain != nft.DefaultChain {
		t.Errorf("foreign %+v", foreign)
	}
	if n := messages(o.removable()); n != 6 {
		t.Errorf("%d removal messages, want 6 (2 jumps, 2 flushes, 2 deletes)", n)
	}
	named := o
	named.Chain = nft.DefaultChain
	if n := messages(named.removable()); n != 8 || named.Fingerprint() == o.Fingerprint() {
		t.Errorf("%d removal messages with the chain named, want 8", n)
	}
	// custom-masq is jumped to first: 10.1.2.3 returns there, then IP-MASQ masquerades it.
	if e, decided := o.ExplainOriginal(netip.MustParseAddr("10.1.2.3"), false); !decided || !e.Masquerade || !strings.Contains(e.Reason, "chain IP-MASQ rule 1") {
		t.Errorf("10.1.2.3: %v %+v", decided, e)
	}
	for _, f := range o.Families { // IPv4's chains are all there, IPv6 has none
		if f.Present() != (f.Family == 4) {
			t.Errorf("family %d chain %s: present %v", f.Family, f.Chain, f.Present())
		}
	}
}

func TestOriginalDescribe(t *testing.T) {
	o := originalForTest()
	f := o.Families[0]
	if !f.Recognised() || !o.Present() || o.Families[1].Present() {
		t.Fatalf("recognised %v present %v", f.Recognised(), o.Present())
	}
	for got, want := range map[string]string{
		f.Jumps[0].Text:      `-m comment --comment "ip-masq-agent: ensure nat POSTROUTING directs all non-LOCAL destination traffic to our custom IP-MASQ-AGENT chain" -m addrtype ! --dst-type LOCAL counter jump IP-MASQ-AGENT`,
		f.Exemptions[0].Text: "ip daddr 192.168.0.0/20 counter accept",
		f.Rules[0].Text:      `ip daddr 10.0.0.0/8 -m comment --comment "ip-masq-agent: local traffic is not subject to MASQUERADE" counter return`,
		f.Rules[1].Verdict:   "masquerade",
		o.Fingerprint():      "IP-MASQ-AGENT@4:1:j3,4,5,;",
		o.Families[1].Table() + " " + o.Families[1].MetricFamily(): "ip6 nat ipv6",
	} {
		if got != want {
			t.Errorf("got  %s\nwant %s", got, want)
		}
	}
	if s := f.Summary(); !strings.Contains(s, "chain IP-MASQ-AGENT (2 rules); POSTROUTING rule (handle 3)") {
		t.Errorf("summary %s", s)
	}
	if c := LegacyCommands("IP-MASQ", "ip6tables"); len(c) != 3 || !strings.HasPrefix(c[0], `ip6tables-legacy -t nat -D POSTROUTING -m comment --comment "ip-masq-agent: ensure nat POSTROUTING directs all non-LOCAL destination traffic to our custom IP-MASQ chain" -m addrtype ! --dst-type LOCAL -j IP-MASQ`) || c[2] != "ip6tables-legacy -t nat -X IP-MASQ" {
		t.Errorf("legacy commands %q", c)
	}
	if n := messages(o); n != 3 { // the jump, flush, delete chain
		t.Errorf("%d removal messages, want 3", n)
	}
	// A chain without the original's comments is not recognised.
	g := Family{Family: 4, Chain: "X", ChainPresent: true, Rules: []XTRule{{Text: "accept"}}}
	if g.Recognised() || (Family{}).Recognised() {
		t.Error("a foreign chain recognised")
	}
}

func TestOriginalExplain(t *testing.T) {
	o := originalForTest()
	local := func(s string) bool { return s == "10.244.1.1" }
	for _, tc := range []struct {
		addr           string
		decided, masq  bool
		reasonContains string
	}{
		{"203.0.113.10", true, true, "masqueraded by the original ip-masq-agent's rules in table ip nat"},
		{"10.1.2.3", false, false, "chain IP-MASQ-AGENT rule 1 returns"},
		{"192.168.3.4", false, false, "accepts it before the original agent's jump"},
		{"10.244.1.1", false, false, ""},
		{"2001:db8::1", false, false, ""},
	} {
		e, decided := o.ExplainOriginal(netip.MustParseAddr(tc.addr), local(tc.addr))
		if decided != tc.decided || e.Masquerade != tc.masq || !strings.Contains(e.Reason, tc.reasonContains) {
			t.Errorf("%s: decided %v masquerade %v reason %q", tc.addr, decided, e.Masquerade, e.Reason)
		}
	}
	// A rule that matches on the source is undetermined.
	src := newXTRule(7, []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 2},
		&expr.Cmp{Register: 1, Data: []byte{10, 244}}, &expr.Verdict{Kind: expr.VerdictReturn}}, nil)
	if src.Text != "ip saddr 10.244.0.0/16 return" {
		t.Errorf("text %q", src.Text)
	}
	o.Families[0].Exemptions = []XTRule{src}
	if e, decided := o.ExplainOriginal(netip.MustParseAddr("203.0.113.10"), false); !decided || !e.Undetermined {
		t.Errorf("source exemption: %+v %v", e, decided)
	}
}

func TestFakeOriginal(t *testing.T) {
	f := &Fake{}
	f.SetOriginal(originalForTest())
	o, _ := f.FindOriginal(nft.DefaultChain)
	fp := o.Fingerprint()
	f.RewriteOriginal()
	if _, err := f.RemoveOriginal(nft.DefaultChain, fp); err != ErrChanged {
		t.Fatalf("stale removal: %v", err)
	}
	if other, _ := f.FindOriginal("IP-MASQ"); !other.Present() {
		t.Error("the rules are found by what they are, not by the name asked for")
	}
	if _, err := f.RemoveOriginal(nft.DefaultChain, ""); err != nil || f.Removals() != 1 {
		t.Fatalf("removal: %v", err)
	}
	if o, _ := f.FindOriginal(nft.DefaultChain); o.Present() {
		t.Error("still present")
	}
}

// messages counts the netlink messages of a removal: a jump by handle is
// one, a chain two (its flush and its deletion).
func messages(o Rules) (n int) {
	for _, d := range deletions(o) {
		n++
		if d.Handle == 0 {
			n++
		}
	}
	return n
}

package nft

import (
	"bytes"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
	"golang.org/x/sys/unix"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
)

// Explanation says what the agent's rules do with new connections from a
// pod to one destination address, and why.
type Explanation struct {
	Addr       netip.Addr
	Masquerade bool
	// Undetermined is set when the rules' outcome does not follow from the
	// destination alone (a rule added by someone else matches on
	// something else); Masquerade is then meaningless.
	Undetermined bool
	// Reason names what decided, e.g. "nonMasqueradeCIDRs[2] 10.0.0.0/8",
	// "link-local 169.254.0.0/16 (masqLinkLocal: false)",
	// "masqOutBound: true (no other rule matched)".
	Reason string
	// Rule is the rule that decided, in nft syntax; "" when none did.
	Rule string
}

// Verdict is "masquerade", "not masqueraded" or "undetermined".
func (e Explanation) Verdict() string {
	switch {
	case e.Undetermined:
		return "undetermined"
	case e.Masquerade:
		return "masquerade"
	}
	return "not masqueraded"
}

// Explain says what the ruleset Build makes of cfg and o does with traffic
// to addr, from the config alone: the rules are evaluated as the kernel
// evaluates them (Build's decision chain, first match wins), and the
// reason names the config entry behind the set element that matched. It
// cannot know the node's own addresses, which the kernel never
// masquerades (the base chain's `fib daddr type != local`).
func Explain(cfg config.Config, o Options, addr netip.Addr) Explanation {
	addr = addr.Unmap()
	e := Explanation{Addr: addr}
	if addr.Is6() && !o.EnableIPv6 {
		e.Reason = "IPv6 is not handled without --enable-ipv6"
		return e
	}
	t := Build(cfg, o)
	fam := Family(4)
	if addr.Is6() {
		fam = 6
	}
	for _, r := range t.DecisionChain().Rules {
		if r.Family != 0 && r.Family != fam {
			continue
		}
		var matched netip.Prefix
		if r.DaddrSet != "" {
			elem, ok := lookup(t.Set(r.DaddrSet).Elements, addr)
			if !ok {
				continue
			}
			matched, _ = elem.Prefix() // Build makes one range per prefix
		}
		e.Rule = RenderRule(r)
		e.Masquerade = r.Verdict == Goto && r.Target == MasqChainName
		switch {
		case matched.IsValid() && e.Masquerade:
			e.Reason = source("masqueradeCIDRs", cfg.MasqueradeCIDRs, matched, false)
		case matched.IsValid():
			e.Reason = source("nonMasqueradeCIDRs", cfg.NonMasqueradeCIDRs, matched, isDefaultList(cfg.NonMasqueradeCIDRs))
		case fam == 6:
			e.Reason = "masqOutBoundIPv6: true (no other rule matched)"
		default:
			e.Reason = "masqOutBound: true (no other rule matched)"
		}
		return e
	}
	e.Reason = "masqOutBound: false (no other rule matched)"
	if fam == 6 {
		e.Reason = "masqOutBoundIPv6: false (no other rule matched)"
	}
	return e
}

// source names the config entry behind a set element: the first entry of
// the list equal to it (normalization keeps, of nested entries, the
// widest, which is one of them), or the link-local default.
func source(key string, list []netip.Prefix, p netip.Prefix, defaults bool) string {
	for i, q := range list {
		if q.Addr().Is4In6() && q.Bits() >= 96 {
			q = netip.PrefixFrom(q.Addr().Unmap(), q.Bits()-96)
		}
		if q.Masked() == p {
			if defaults {
				return fmt.Sprintf("%s[%d] %s (the default list)", key, i, p)
			}
			return fmt.Sprintf("%s[%d] %s", key, i, p)
		}
	}
	switch p {
	case config.LinkLocalIPv4:
		return fmt.Sprintf("link-local %s (masqLinkLocal: false)", p)
	case config.LinkLocalIPv6:
		return fmt.Sprintf("link-local %s (masqLinkLocalIPv6: false)", p)
	}
	return fmt.Sprintf("%s %s", key, p)
}

// isDefaultList reports whether a nonMasqueradeCIDRs list is one of the
// defaults (with or without --nomasq-all-reserved-ranges).
func isDefaultList(ps []netip.Prefix) bool {
	for _, r := range []bool{false, true} {
		if slices.Equal(ps, config.Default(config.Flags{NoMasqAllReservedRanges: r}).NonMasqueradeCIDRs) {
			return true
		}
	}
	return false
}

// ExplainTable says what the kernel's table, as Read returned it, does
// with traffic to addr: its base chains hooked at nat postrouting are
// evaluated in priority order as the kernel would, expression by
// expression (the first chain that masquerades wins). isLocal says
// whether an address is one of the node's own (fib daddr type local); nil
// means none is.
func ExplainTable(t *Table, addr netip.Addr, isLocal func(netip.Addr) bool) Explanation {
	addr = addr.Unmap()
	ev := &evaluator{t: t, addr: addr, local: isLocal != nil && isLocal(addr)}
	base := BaseChainName
	e := Explanation{Addr: addr}
	bases := t.natPostrouting()
	if len(bases) == 0 {
		e.Reason = "the table has no chain hooked at nat postrouting: it masquerades nothing"
		return e
	}
	last := result{}
	for _, c := range bases {
		res := ev.chain(c, 0, nil)
		base = c.Name
		switch res.outcome {
		case outMasquerade:
			e.Masquerade = true
			e.Reason, e.Rule = ev.reason(res, base)
			return e
		case outUndetermined:
			e.Undetermined = true
			e.Reason, e.Rule = ev.reason(res, base)
			return e
		case outDrop:
			e.Reason, e.Rule = ev.reason(res, base)
			e.Reason = "dropped: " + e.Reason
			return e
		}
		if len(res.steps) > 0 || len(last.steps) == 0 {
			last = res
		}
	}
	e.Reason, e.Rule = ev.reason(last, base)
	return e
}

// natPostrouting returns the base chains hooked at nat postrouting, in
// the order the kernel runs them (by priority).
func (t *Table) natPostrouting() []*Chain {
	var bases []*Chain
	for i := range t.Chains {
		if h := t.Chains[i].Hook; h != nil && h.Type == "nat" && h.Hook == "postrouting" {
			bases = append(bases, &t.Chains[i])
		}
	}
	sort.SliceStable(bases, func(i, j int) bool { return bases[i].Hook.Priority < bases[j].Hook.Priority })
	return bases
}

type outcome uint8

const (
	outReturn outcome = iota // fell off or returned: not decided here
	outMasquerade
	outAccept
	outDrop
	outUndetermined
)

type result struct {
	outcome outcome
	steps   []step // the rules that matched with a verdict, outermost first
	why     string // for outUndetermined
}

// step is a rule that matched on the way.
type step struct {
	chain   string
	index   int // 1-based
	text    string
	set     string // the set a lookup matched in, if any
	element string
	verdict string
}

type evaluator struct {
	t     *Table
	addr  netip.Addr
	local bool
	quiet bool // no rule texts, no steps (Decide)

	regs      map[uint32][]byte // reused by match
	addrBytes []byte
}

const maxDepth = 16 // nft refuses deeper jumps too

// chain walks c's rules as the kernel does; path holds the steps that led
// to c.
func (ev *evaluator) chain(c *Chain, depth int, path []step) result {
	if depth > maxDepth {
		return result{outcome: outUndetermined, steps: path, why: fmt.Sprintf("jumps nest deeper than %d", maxDepth)}
	}
	var maybeMasq []step // rules that masquerade for some packets only
	for i, r := range c.Rules {
		m, s := ev.match(r)
		s.chain, s.index, s.verdict = c.Name, i+1, ruleVerdict(r)
		if !ev.quiet {
			s.text = RenderRule(r)
		}
		switch {
		case m == MatchNo || s.verdict == "":
			continue
		case m == MatchUnknown && s.verdict == "masquerade":
			maybeMasq = append(maybeMasq, s)
			continue
		case m == MatchUnknown:
			return result{outcome: outUndetermined, steps: append(path, s),
				why: fmt.Sprintf("rule %d of chain %s matches on more than the destination", s.index, c.Name)}
		}
		var steps []step
		if !ev.quiet {
			steps = append(slices.Clone(path), s)
		}
		var res result
		switch s.verdict {
		case "masquerade":
			res = result{outcome: outMasquerade, steps: steps}
		case "accept":
			res = result{outcome: outAccept, steps: steps}
		case "drop":
			res = result{outcome: outDrop, steps: steps}
		case "return":
			res = result{outcome: outReturn, steps: steps}
		default: // jump or goto
			target := ev.t.Chain(r.target())
			if target == nil {
				return result{outcome: outUndetermined, steps: steps, why: "a jump to a missing chain"}
			}
			res = ev.chain(target, depth+1, steps)
			if res.outcome == outReturn && strings.HasPrefix(s.verdict, "jump") {
				path = res.steps // back from the jump: go on with the next rule
				continue
			}
		}
		return settle(res, maybeMasq)
	}
	return settle(result{outcome: outReturn, steps: path}, maybeMasq)
}

// settle turns an outcome other than masquerade into undetermined when a
// rule on the way masquerades some packets.
func settle(r result, maybeMasq []step) result {
	if len(maybeMasq) == 0 || r.outcome == outMasquerade || r.outcome == outUndetermined {
		return r
	}
	s := maybeMasq[0]
	return result{outcome: outUndetermined, steps: append(r.steps, s),
		why: fmt.Sprintf("rule %d of chain %s masquerades some packets to this destination", s.index, s.chain)}
}

// reason describes a result: the deciding rule and why it matched.
func (ev *evaluator) reason(r result, base string) (reason, rule string) {
	n := len(r.steps)
	if r.why != "" {
		if n == 0 {
			return r.why, ""
		}
		return r.why, r.steps[n-1].text
	}
	if n == 0 {
		if ev.local {
			return "a local address of the node is never masqueraded (fib daddr type local)", ""
		}
		return "no rule of chain " + base + " matched", ""
	}
	d := r.steps[n-1]
	switch {
	case d.verdict == "masquerade" && n > 1 && r.steps[n-2].verdict != "" && strings.HasSuffix(r.steps[n-2].verdict, " "+d.chain):
		d = r.steps[n-2] // the rule that sent it to the masquerade chain
	case r.outcome == outReturn && d.verdict != "return":
		// fell off the end of the chain the last step jumped to
		return fmt.Sprintf("no rule of chain %s matched (after chain %s rule %d)", d.verdict[strings.Index(d.verdict, " ")+1:], d.chain, d.index), d.text
	}
	where := fmt.Sprintf("chain %s rule %d", d.chain, d.index)
	if d.set != "" {
		return fmt.Sprintf("set %s holds %s (%s)", d.set, d.element, where), d.text
	}
	return where, d.text
}

// Match is whether a rule matches a packet: yes, no, or cannot tell
// (it matches on more than the destination).
type Match uint8

const (
	MatchYes Match = iota
	MatchNo
	MatchUnknown
)

// MatchExprs evaluates the expressions of a rule of another table (the
// original agent's, say) on a packet to addr (local: an address of the
// node), with the evaluator that explains the agent's own rules.
func MatchExprs(exprs []expr.Any, addr netip.Addr, local bool) Match {
	m, _ := (&evaluator{addr: addr, local: local}).match(Rule{exprs: exprs})
	return m
}

// match evaluates a rule's expressions up to its verdict on a packet to
// ev.addr. The step it returns records the set element a lookup matched.
func (ev *evaluator) match(r Rule) (Match, step) {
	var s step
	if ev.regs == nil {
		ev.regs, ev.addrBytes = map[uint32][]byte{}, ev.addr.AsSlice()
	}
	regs := ev.regs // a missing register is unknown
	clear(regs)
	unknown := false
	for _, e := range r.expressions() {
		switch e := e.(type) {
		case *expr.Meta:
			delete(regs, e.Register)
			if e.Key == expr.MetaKeyNFPROTO && !e.SourceRegister {
				if ev.addr.Is4() {
					regs[e.Register] = []byte{unix.NFPROTO_IPV4}
				} else {
					regs[e.Register] = []byte{unix.NFPROTO_IPV6}
				}
			}
		case *expr.Payload:
			// The destination address, or part of it (iptables-nft loads
			// only the bytes a prefix covers).
			delete(regs, e.DestRegister)
			addr, daddr := ev.addrBytes, 16
			if ev.addr.Is6() {
				daddr = 24
			}
			if off := int(e.Offset) - daddr; e.OperationType == expr.PayloadLoad && e.Base == expr.PayloadBaseNetworkHeader &&
				off >= 0 && off+int(e.Len) <= len(addr) {
				regs[e.DestRegister] = addr[off : off+int(e.Len)]
			}
		case *expr.Match: // iptables-nft's xt matches
			switch i := e.Info.(type) {
			case *xt.Comment:
			case *xt.AddrTypeV1:
				// Only the destination's LOCAL (or not): a pod's
				// destination is local or unicast.
				if i.Source != 0 || i.Flags&^0x2 != 0 || i.Dest&^uint16(xt.AddrTypeLocal) != 0 {
					unknown = true
					continue
				}
				if is := ev.local != (i.Flags&0x2 != 0); !is {
					return MatchNo, s
				}
			default:
				unknown = true
			}
		case *expr.Fib:
			delete(regs, e.Register)
			if e.FlagDADDR && e.ResultADDRTYPE && !e.FlagSADDR && !e.FlagIIF && !e.FlagOIF && !e.FlagMARK {
				typ := uint32(unix.RTN_UNICAST)
				if ev.local {
					typ = unix.RTN_LOCAL
				}
				regs[e.Register] = rtnType[typ]
			}
		case *expr.Bitwise:
			v, ok := regs[e.SourceRegister]
			delete(regs, e.DestRegister)
			if ok && len(e.Mask) == len(v) && len(e.Xor) == len(v) {
				out := make([]byte, len(v))
				for i := range v {
					out[i] = v[i]&e.Mask[i] ^ e.Xor[i]
				}
				regs[e.DestRegister] = out
			}
		case *expr.Immediate:
			regs[e.Register] = e.Data
		case *expr.Cmp:
			v, ok := regs[e.Register]
			if !ok || len(v) != len(e.Data) {
				unknown = true
				continue
			}
			c := bytes.Compare(v, e.Data)
			if !cmpHolds(e.Op, c) {
				return MatchNo, s
			}
		case *expr.Range:
			v, ok := regs[e.Register]
			if !ok || len(v) != len(e.FromData) {
				unknown = true
				continue
			}
			in := bytes.Compare(v, e.FromData) >= 0 && bytes.Compare(v, e.ToData) <= 0
			if in != (e.Op == expr.CmpOpEq) {
				return MatchNo, s
			}
		case *expr.Lookup:
			v, ok := regs[e.SourceRegister]
			set := ev.t.Set(e.SetName)
			a, isAddr := netip.AddrFromSlice(v)
			if !ok || set == nil || e.IsDestRegSet || !isAddr {
				unknown = true
				continue
			}
			elem, found := lookup(set.Elements, a)
			if found == e.Invert {
				return MatchNo, s
			}
			if found {
				s.set, s.element = set.Name, rangeString(elem)
			}
		case *expr.Counter, *expr.Verdict, *expr.Masq, *expr.NAT, *expr.Target:
			// statements: no match
		default:
			// numgen, ct, limit, ...: what they load or match is unknown
			if d, ok := destRegister(e); ok {
				delete(regs, d)
			} else {
				unknown = true
			}
		}
	}
	if unknown {
		return MatchUnknown, s
	}
	return MatchYes, s
}

// rtnType is fib's address type results as registers hold them.
var rtnType = map[uint32][]byte{
	unix.RTN_UNICAST: binaryutil.NativeEndian.PutUint32(unix.RTN_UNICAST),
	unix.RTN_LOCAL:   binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL),
}

// cmpHolds says whether a cmp with op holds for a comparison result c.
func cmpHolds(op expr.CmpOp, c int) bool {
	switch op {
	case expr.CmpOpEq:
		return c == 0
	case expr.CmpOpNeq:
		return c != 0
	case expr.CmpOpLt:
		return c < 0
	case expr.CmpOpLte:
		return c <= 0
	case expr.CmpOpGt:
		return c > 0
	case expr.CmpOpGte:
		return c >= 0
	}
	return false
}

// destRegister returns the register an expression loads, for the
// expressions that only load.
func destRegister(e expr.Any) (uint32, bool) {
	switch e := e.(type) {
	case *expr.Numgen:
		return e.Register, true
	case *expr.Ct:
		return e.Register, true
	case *expr.Byteorder:
		return e.DestRegister, true
	}
	return 0, false
}

// ruleVerdict is "masquerade", "accept", "drop", "return", "jump CHAIN",
// "goto CHAIN", or "" for a rule without one.
func ruleVerdict(r Rule) string {
	for _, e := range r.expressions() {
		switch e := e.(type) {
		case *expr.Masq, *expr.NAT:
			return "masquerade"
		case *expr.Verdict:
			switch e.Kind {
			case expr.VerdictAccept:
				return "accept"
			case expr.VerdictDrop:
				return "drop"
			case expr.VerdictReturn:
				return "return"
			case expr.VerdictJump:
				return "jump " + e.Chain
			case expr.VerdictGoto:
				return "goto " + e.Chain
			}
		}
	}
	return ""
}

func (r Rule) target() string {
	for _, e := range r.expressions() {
		if v, ok := e.(*expr.Verdict); ok && (v.Kind == expr.VerdictJump || v.Kind == expr.VerdictGoto) {
			return v.Chain
		}
	}
	return ""
}

// Decide says what the table does with a new connection from a pod to
// addr, as the kernel evaluates it: masquerade or not, and whether the
// table handles addr's family at all (IPv6 without --enable-ipv6 is not;
// neither is anything when there is no table). It is for the conntrack
// cleanup, which asks it of the wanted table and of the table the kernel
// held before: the base chains hooked at nat postrouting in priority
// order (with their policy), the jumps, the rules, foreign ones included,
// a dormant table (which decides nothing), as ExplainTable evaluates them
// without the reasons; sets are looked up by binary search. A destination
// whose outcome is undetermined (a foreign rule matches on more than the
// destination) is not handled: the cleanup then keeps its entries.
func (t Table) Decide(addr netip.Addr) (masquerade, handled bool) {
	return t.decide(addr)
}

// Decider returns Decide for many addresses: the rules' expressions are
// encoded once (a table read back has them already).
func (t Table) Decider() func(netip.Addr) (masquerade, handled bool) {
	c := t.Clone()
	for i := range c.Chains {
		for j := range c.Chains[i].Rules {
			r := &c.Chains[i].Rules[j]
			r.exprs = r.expressions()
		}
	}
	return c.decide
}

func (t *Table) decide(addr netip.Addr) (masquerade, handled bool) {
	addr = addr.Unmap()
	fam := Family(4)
	if addr.Is6() {
		fam = 6
	}
	c := t.DecisionChain()
	if c == nil {
		return false, false
	}
	for _, r := range c.Rules {
		if r.Foreign != "" || r.Family == 0 || r.Family == fam {
			handled = true
			break
		}
	}
	if !handled || t.Dormant {
		return false, handled
	}
	ev := &evaluator{t: t, addr: addr, quiet: true}
	for _, b := range t.natPostrouting() {
		switch res := ev.chain(b, 0, nil); {
		case res.outcome == outMasquerade:
			return true, true
		case res.outcome == outUndetermined:
			return false, false
		case res.outcome == outDrop, res.outcome == outReturn && b.Hook.Policy == "drop":
			return false, true
		}
	}
	return false, true
}

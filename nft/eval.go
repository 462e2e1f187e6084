package nft

import (
	"bytes"
	"fmt"
	"net/netip"
	"slices"
	"sort"

	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
	"golang.org/x/sys/unix"
)

// One evaluator of what rules do with a new connection from a pod (a
// Packet: source, destination, out interface), as the kernel evaluates
// them, expression by expression, loading the bytes of the packet each
// selector's expression asks for (selector.go):
// Decider is it without reasons (the conntrack cleanup), Explain and
// ExplainTable are it with reasons (explain.go), EvalChain offers it for
// one chain of any table, and MatchExprs, RuleVerdict, RuleTarget and
// RulePasses for one rule (the original agent's iptables-nft rules,
// package original).

// evaluation is what a table does with a new connection.
type evaluation struct {
	handled bool   // the table's decision chain has a rule for the address's family (Decider's handled)
	dormant bool   // the table is switched off: it decides nothing
	noBase  bool   // no chain is hooked at nat postrouting
	base    string // the last base chain evaluated
	result         // what decided: of the base chain that masqueraded, dropped or was undetermined, else the last that matched a rule
	reads   uint8  // the selectors the evaluation read, a bit each (1 << Selector)
}

// evaluate runs the table's base chains hooked at nat postrouting in
// priority order, as the kernel does, on a new connection p (local: its
// destination is one of the node's own addresses). Without reasons it
// records no steps or rule texts, and evaluates nothing for a destination
// it does not handle.
func (t *Table) evaluate(p Packet, local, reasons bool) (ev evaluation) {
	p = p.unmapped()
	ev.handled = t.handles(p.Dst)
	if (!ev.handled && !reasons) || t.Dormant {
		ev.dormant = t.Dormant
		return ev
	}
	bases := t.natPostrouting()
	if len(bases) == 0 {
		ev.noBase = true
		return ev
	}
	e := &evaluator{t: t, pkt: p, local: local, quiet: !reasons}
	defer func() { ev.reads = e.reads }()
	for _, b := range bases {
		res := e.chain(b, 0, nil)
		ev.base = b.Name
		if res.outcome == outReturn && b.Hook.Policy == "drop" {
			res.outcome = outDrop
			if reasons {
				res.why = fmt.Sprintf("no rule of chain %s decided, and its policy is drop", b.Name)
			}
		}
		switch res.outcome {
		case outMasquerade, outUndetermined, outDrop:
			ev.result = res
			return ev
		}
		// accept or return: the next base chain decides
		if len(res.steps) > 0 || len(ev.steps) == 0 {
			ev.result = res
		}
	}
	return ev
}

// handles reports whether the table's decision chain has a rule for
// addr's family (or a foreign rule, which may be for any family): without
// one (IPv6 without --enable-ipv6, or no table) the agent leaves addr's
// connections alone.
func (t *Table) handles(addr netip.Addr) bool {
	c := t.DecisionChain()
	if c == nil {
		return false
	}
	fam := familyOf(addr)
	for _, r := range c.Rules {
		if r.Foreign != "" || r.Family == 0 || r.Family == fam {
			return true
		}
	}
	return false
}

func familyOf(addr netip.Addr) Family {
	if addr.Is6() {
		return 6
	}
	return 4
}

// Decider returns what the table does with new connections from pods, as
// the kernel evaluates them: for a packet p, masquerade or not, and
// whether the table handles its destination's family at all (IPv6 without
// --enable-ipv6 is not; neither is anything when there is no table). It
// is for the conntrack cleanup, which asks it of the wanted table and of
// the table the kernel held before: the base chains hooked at nat
// postrouting in priority order (with their policy), the jumps, the
// rules, foreign ones included, a dormant table (which decides nothing),
// as ExplainTable evaluates them without the reasons; sets are looked up
// by binary search. A destination whose outcome is undetermined (a
// foreign rule matches on more than the packet says) is not handled: the
// cleanup then keeps its entries. The rules' expressions are
// encoded once (a table read back has them already), and the answers are
// remembered (up to deciderMemo of them) by destination alone when the
// evaluation read nothing else of the packet, else by the whole packet:
// an evaluation that did not read a field cannot depend on it. It is not
// safe for concurrent use, and it reads t's sets' elements, not a copy.
func (t Table) Decider() func(Packet) (masquerade, handled bool) {
	return newDecider(t).decide
}

// decider is a Decider's table and memory.
type decider struct {
	t        Table
	byDst    map[netip.Addr]uint8 // answers of evaluations that read only the destination
	byPacket map[Packet]uint8     // the others'
}

func newDecider(t Table) *decider {
	// The rules get their expressions: a copy of the chains. The sets
	// are only looked up, and nothing changes a table's elements in
	// place (ExecPlan runs a plan on a copy): shared, not copied (two
	// copies of 100,000 elements at every cleanup).
	c := t
	c.Chains = slices.Clone(t.Chains)
	for i := range c.Chains {
		c.Chains[i].Rules = slices.Clone(c.Chains[i].Rules)
		for j := range c.Chains[i].Rules {
			r := &c.Chains[i].Rules[j]
			r.exprs = r.expressions()
		}
	}
	return &decider{t: c, byDst: map[netip.Addr]uint8{}, byPacket: map[Packet]uint8{}}
}

func (d *decider) decide(p Packet) (bool, bool) {
	v, ok := d.byDst[p.Dst.Unmap()]
	if !ok {
		p = p.unmapped()
		v, ok = d.byPacket[p]
	}
	if ok {
		return v&1 != 0, v&2 != 0
	}
	masq, handled, reads := d.t.decide(p)
	if len(d.byDst)+len(d.byPacket) >= deciderMemo {
		clear(d.byDst)
		clear(d.byPacket)
	}
	v = 0
	if masq {
		v |= 1
	}
	if handled {
		v |= 2
	}
	if reads&^(1<<SelDaddr) == 0 {
		d.byDst[p.Dst] = v
	} else {
		d.byPacket[p] = v
	}
	return masq, handled
}

// deciderMemo bounds the answers a Decider remembers: the conntrack
// cleanup asks once per entry, and many entries share a destination.
const deciderMemo = 1 << 16

func (t *Table) decide(p Packet) (masquerade, handled bool, reads uint8) {
	ev := t.evaluate(p, false, false)
	if ev.outcome == outUndetermined {
		return false, false, ev.reads
	}
	return ev.outcome == outMasquerade, ev.handled, ev.reads
}

// Match says whether a rule's matches hold for a connection.
type Match uint8

const (
	MatchYes Match = iota
	MatchNo
	MatchUnknown // the rule matches on more than the packet says (its selectors, its destination's address type)
)

// MatchExprs evaluates the expressions of a rule of any table (the
// original agent's iptables-nft rules, say) on a new connection p from a
// pod (local: its destination is one of the node's own addresses), with
// the evaluator of Decider and ExplainTable: whether its matches hold (set
// lookups are unknown). RuleVerdict says what the rule then does.
func MatchExprs(exprs []expr.Any, p Packet, local bool) Match {
	m, _ := (&evaluator{pkt: p.unmapped(), local: local}).matchExprs(exprs)
	return m
}

// RuleVerdict is the verdict of a rule's expressions, as the evaluator
// takes it: "masquerade", "accept", "drop", "return", "jump CHAIN",
// "goto CHAIN", "-j TARGET" (an xtables target of iptables-nft's other
// than MASQUERADE), or "" for a rule without one.
func RuleVerdict(exprs []expr.Any) string {
	v, _, _ := verdictOf(exprs)
	return v
}

// RuleTarget is the chain a rule of any table jumps or goes to ("" for
// the other verdicts).
func RuleTarget(exprs []expr.Any) string {
	_, _, chain := verdictOf(exprs)
	return chain
}

// RulePasses reports whether a rule of any table, when it matches, ends
// its chain without translating the address: its verdict is accept or
// return.
func RulePasses(exprs []expr.Any) bool {
	_, v, _ := verdictOf(exprs)
	return v != nil && (v.kind == expr.VerdictAccept || v.kind == expr.VerdictReturn)
}

// ChainVerdict is what the rules of one chain do with a new connection
// (EvalChain).
type ChainVerdict struct {
	Masquerade bool // rule Rule masquerades it
	// Passes: the connection leaves the chain without a translation, by
	// rule Rule's return, or, with Rule 0, through the chain's end.
	Passes bool
	// Undetermined: the outcome depends on more than the destination, or
	// is not known here (a jump out of the chain); Rule is the rule that
	// made it so, Why says how.
	Undetermined bool
	// Otherwise rule Rule ends the chain with Verdict (accept, drop).
	Verdict string
	Rule    int // 1-based; 0: none
	Why     string
}

// EvalChain evaluates the rules of one chain of any table (FoundRule of
// the original agent's iptables-nft rules, say) on a new connection p
// from a pod (local: its destination is one of the node's own addresses)
// with the evaluator of Decider and ExplainTable. The chain is taken on
// its own: its set lookups are unknown, and so is where a jump or goto
// leads.
func EvalChain(name string, rules []Rule, p Packet, local bool) ChainVerdict {
	res := (&evaluator{pkt: p.unmapped(), local: local}).chain(&Chain{Name: name, Rules: rules}, 0, nil)
	out := ChainVerdict{
		Masquerade:   res.outcome == outMasquerade,
		Passes:       res.outcome == outReturn,
		Undetermined: res.outcome == outUndetermined,
		Why:          res.why,
	}
	if n := len(res.steps); n > 0 {
		out.Verdict, out.Rule = res.steps[n-1].verdict, res.steps[n-1].index
	}
	return out
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
	why     string // for outUndetermined, and a drop by policy
}

// step is a rule that matched on the way.
type step struct {
	chain   string
	index   int // 1-based
	text    string
	set     string // the set a lookup matched in, if any
	element Range  // the element it matched
	notIn   bool   // the lookup is inverted: the set does not hold the packet's
	key     SetKey // the set's key type (how to write element)
	verdict string
	target  string // the chain a jump or goto leads to
}

type evaluator struct {
	t     *Table
	pkt   Packet
	local bool
	quiet bool  // no rule texts, no steps (Decider)
	reads uint8 // the selectors loaded, a bit each (1 << Selector): what the outcome depends on

	regs    map[uint32][]byte // reused by match
	fam     Family            // the packet's
	nfproto []byte
	vals    [len(selectors)][]byte // what the packet holds for each selector, once loaded
	valSet  uint8                  // which of vals are
}

// value is what the packet holds for selector s (nil: unknown); reading
// it is recorded in reads.
func (ev *evaluator) value(s Selector) []byte {
	ev.reads |= 1 << s
	if ev.valSet&(1<<s) == 0 {
		ev.vals[s], ev.valSet = selectors[s].value(ev.pkt), ev.valSet|1<<s
	}
	return ev.vals[s]
}

const maxDepth = 16 // nft refuses deeper jumps too

// chain walks c's rules as the kernel does; path holds the steps that led
// to c. Without a table (EvalChain) c is taken on its own: where a jump
// or goto leads is not known.
func (ev *evaluator) chain(c *Chain, depth int, path []step) result {
	if depth > maxDepth {
		return result{outcome: outUndetermined, steps: path, why: fmt.Sprintf("jumps nest deeper than %d", maxDepth)}
	}
	var maybeMasq []step // rules that masquerade for some packets only
	for i := range c.Rules {
		r := &c.Rules[i]
		exprs := r.expressions()
		m, s := ev.matchExprs(exprs)
		var v *nftVerdict
		s.chain, s.index = c.Name, i+1
		s.verdict, v, s.target = verdictOf(exprs)
		if !ev.quiet {
			s.text = RenderRule(*r)
		}
		switch {
		case m == MatchNo || s.verdict == "":
			continue
		case m == MatchUnknown && s.verdict == verdictMasquerade:
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
		switch {
		case s.verdict == verdictMasquerade:
			res = result{outcome: outMasquerade, steps: steps}
		case v == nil || (v.chain && ev.t == nil): // -j TARGET, or a jump out of a chain on its own
			return result{outcome: outUndetermined, steps: steps,
				why: fmt.Sprintf("rule %d of chain %s: %s", s.index, c.Name, s.verdict)}
		case v.chain: // jump or goto
			next := ev.t.Chain(s.target)
			if next == nil {
				return result{outcome: outUndetermined, steps: steps, why: "a jump to a missing chain"}
			}
			res = ev.chain(next, depth+1, steps)
			if res.outcome == outReturn && v.kind == expr.VerdictJump {
				path = res.steps // back from the jump: go on with the next rule
				continue
			}
		default: // return, accept, drop
			res = result{outcome: verdictOutcome[v.kind], steps: steps}
		}
		return settle(res, maybeMasq)
	}
	return settle(result{outcome: outReturn, steps: path}, maybeMasq)
}

// verdictOutcome is what the verdicts that end a chain decide.
var verdictOutcome = map[expr.VerdictKind]outcome{
	expr.VerdictReturn: outReturn,
	expr.VerdictAccept: outAccept,
	expr.VerdictDrop:   outDrop,
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

// matchExprs evaluates a rule's expressions up to its verdict on the
// packet ev.pkt. The step it returns records the set element a lookup matched.
func (ev *evaluator) matchExprs(exprs []expr.Any) (Match, step) {
	var s step
	if ev.regs == nil {
		ev.regs, ev.fam = map[uint32][]byte{}, familyOf(ev.pkt.Dst)
		ev.nfproto = []byte{NFProto(ev.fam)}
	}
	regs := ev.regs // a missing register is unknown
	clear(regs)
	unknown := false
	for _, e := range exprs {
		switch e := e.(type) {
		case *expr.Meta:
			delete(regs, e.Register)
			switch sel := metaSelector(e.Key); {
			case e.SourceRegister:
			case e.Key == expr.MetaKeyNFPROTO:
				regs[e.Register] = ev.nfproto
			case sel != 0:
				if v := ev.value(sel); v != nil {
					regs[e.Register] = v
				}
			}
		case *expr.Payload:
			// A selector's field, or part of it (iptables-nft loads only
			// the bytes a prefix covers).
			delete(regs, e.DestRegister)
			if sel, off := payloadSelector(ev.fam, e); sel != 0 {
				if v := ev.value(sel); v != nil {
					regs[e.DestRegister] = v[off : off+int(e.Len)]
				}
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
			switch {
			case e.Invert:
				s.set, s.notIn = set.Name, true
			case found:
				s.set, s.element, s.key = set.Name, elem, set.Key
			}
		case *expr.Counter, *expr.Log, *expr.Verdict, *expr.Masq, *expr.NAT, *expr.Target:
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

// verdictOf is RuleVerdict, its entry of verdicts (nil for masquerade,
// an xtables target and none), and the chain the rule jumps or goes to.
func verdictOf(exprs []expr.Any) (verdict string, v *nftVerdict, chain string) {
	for _, e := range exprs {
		switch e := e.(type) {
		case *expr.Masq, *expr.NAT:
			return verdictMasquerade, nil, ""
		case *expr.Verdict:
			if v := verdictByKind(e.Kind); v != nil {
				return v.text(e.Chain), v, cond(v.chain, e.Chain)
			}
		case *expr.Target:
			if e.Name == "MASQUERADE" {
				return verdictMasquerade, nil, ""
			}
			return "-j " + e.Name, nil, ""
		}
	}
	return "", nil, ""
}

// target is the chain a rule jumps or goes to.
func (r Rule) target() string {
	_, _, chain := verdictOf(r.expressions())
	return chain
}

package nft

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// ErrNoTable is returned by Read when the kernel has no table inet ip-masq-agent.
var ErrNoTable = errors.New("table inet " + TableName + " does not exist")

// Table is the kernel's table inet ip-masq-agent as read back by Read:
// whatever it holds, the agent's or not.
type Table struct {
	// Sets are every set, in the kernel's order, with Prefixes sorted as
	// Normalize sorts them. Comment is empty: google/nftables v0.3.0
	// does not decode a set's comment.
	Sets   []Set
	Chains []Chain // every chain, in the kernel's order
}

// Chain is a chain read back from the kernel.
type Chain struct {
	Name string
	// Hook describes a base chain as Render writes it ("type nat hook
	// postrouting priority srcnat + 10; policy accept;"); "" for a
	// regular chain.
	Hook  string
	Rules []KernelRule

	natPostrouting bool // a base chain of type nat at hook postrouting
	priority       int
}

// KernelRule is a rule read back from the kernel.
type KernelRule struct {
	// Rule is the rule in the model's terms; nil when the model cannot
	// express it (a rule added by someone else).
	Rule *Rule
	// Text is the rule in nft syntax: RenderRule(*Rule) when Rule is
	// set, otherwise an approximation of nft's.
	Text  string
	exprs []expr.Any
}

// Set returns the set named name, or nil.
func (t *Table) Set(name string) *Set {
	for i := range t.Sets {
		if t.Sets[i].Name == name {
			return &t.Sets[i]
		}
	}
	return nil
}

// Chain returns the chain named name, or nil.
func (t *Table) Chain(name string) *Chain {
	for i := range t.Chains {
		if t.Chains[i].Name == name {
			return &t.Chains[i]
		}
	}
	return nil
}

// Read reads the kernel's table inet ip-masq-agent: its sets with their
// elements (intervals turned back into prefixes) and its chains with their
// rules. It returns ErrNoTable when there is none. It reads only, and
// needs CAP_NET_ADMIN like every nftables request.
//
// google/nftables reads a set's elements through a 4 KiB buffer, so a set
// of 100,000 CIDRs takes a few seconds: fine for a command line tool, not
// for a sync loop (Apply never reads elements).
func (a *Applier) Read() (*Table, error) {
	c, err := nftables.New(nftables.WithNetNSFd(a.NetNS))
	if err != nil {
		return nil, err
	}
	t, err := c.ListTableOfFamily(TableName, nftables.TableFamilyINet)
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNoTable
	}
	if err != nil {
		return nil, fmt.Errorf("read table inet %s: %w", TableName, err)
	}
	out := &Table{}
	sets, err := c.GetSets(t)
	if err != nil {
		return nil, fmt.Errorf("read table inet %s: list sets: %w", TableName, err)
	}
	for _, s := range sets {
		s.Table = t
		elems, err := c.GetSetElements(s)
		if err != nil {
			return nil, fmt.Errorf("read table inet %s: list set %s: %w", TableName, s.Name, err)
		}
		set := Set{Name: s.Name, Family: 4}
		if s.KeyType.Name == nftables.TypeIP6Addr.Name {
			set.Family = 6
		}
		if set.Prefixes, err = elementPrefixes(elems, s.Interval); err != nil {
			return nil, fmt.Errorf("read table inet %s: set %s: %w", TableName, s.Name, err)
		}
		out.Sets = append(out.Sets, set)
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("read table inet %s: list chains: %w", TableName, err)
	}
	for _, ch := range chains {
		if ch.Table == nil || ch.Table.Name != TableName {
			continue
		}
		rules, err := a.rules(ch.Name)
		if err != nil {
			return nil, fmt.Errorf("read table inet %s: list chain %s: %w", TableName, ch.Name, err)
		}
		kc := Chain{Name: ch.Name, Hook: hookText(ch)}
		if ch.Hooknum != nil && *ch.Hooknum == *nftables.ChainHookPostrouting && ch.Type == nftables.ChainTypeNAT {
			kc.natPostrouting = true
			if ch.Priority != nil {
				kc.priority = int(*ch.Priority)
			}
		}
		for _, r := range rules {
			kc.Rules = append(kc.Rules, kernelRule(r))
		}
		out.Chains = append(out.Chains, kc)
	}
	return out, nil
}

// hookText describes a base chain as Render writes it.
func hookText(ch *nftables.Chain) string {
	if ch.Hooknum == nil {
		return ""
	}
	hook := fmt.Sprintf("hook %d", *ch.Hooknum)
	switch *ch.Hooknum {
	case *nftables.ChainHookPrerouting:
		hook = "hook prerouting"
	case *nftables.ChainHookInput:
		hook = "hook input"
	case *nftables.ChainHookForward:
		hook = "hook forward"
	case *nftables.ChainHookOutput:
		hook = "hook output"
	case *nftables.ChainHookPostrouting:
		hook = "hook postrouting"
	}
	prio := "priority 0"
	if ch.Priority != nil {
		p := int(*ch.Priority)
		switch {
		case ch.Type == nftables.ChainTypeNAT && p > 100:
			prio = fmt.Sprintf("priority srcnat + %d", p-100)
		case ch.Type == nftables.ChainTypeNAT && p < 100:
			prio = fmt.Sprintf("priority srcnat - %d", 100-p)
		case ch.Type == nftables.ChainTypeNAT:
			prio = "priority srcnat"
		default:
			prio = fmt.Sprintf("priority %d", p)
		}
	}
	policy := "accept"
	if ch.Policy != nil && *ch.Policy == nftables.ChainPolicyDrop {
		policy = "drop"
	}
	return fmt.Sprintf("type %s %s %s; policy %s;", ch.Type, hook, prio, policy)
}

// elementPrefixes turns a set's elements back into prefixes. An interval
// set holds, per interval, its first address and (flagged as interval end)
// the address after its last; an interval that reaches the top of the
// address space has no end. Intervals that are not one prefix (added by
// someone else, e.g. 10.0.0.1-10.0.0.5) are split into prefixes.
func elementPrefixes(elems []nftables.SetElement, interval bool) ([]netip.Prefix, error) {
	type bound struct {
		addr netip.Addr
		end  bool
	}
	var bs []bound
	for _, e := range elems {
		a, ok := netip.AddrFromSlice(e.Key)
		if !ok {
			return nil, fmt.Errorf("element key of %d bytes is not an address", len(e.Key))
		}
		bs = append(bs, bound{a, e.IntervalEnd})
	}
	var out []netip.Prefix
	if !interval {
		for _, b := range bs {
			out = append(out, netip.PrefixFrom(b.addr, b.addr.BitLen()))
		}
		slices.SortFunc(out, comparePrefix)
		return out, nil
	}
	// Sorted by address; where an interval ends right where the next
	// begins, the end comes first.
	slices.SortFunc(bs, func(x, y bound) int {
		if c := x.addr.Compare(y.addr); c != 0 {
			return c
		}
		if x.end == y.end {
			return 0
		}
		if x.end {
			return -1
		}
		return 1
	})
	var start netip.Addr
	open := false
	for _, b := range bs {
		switch {
		case !b.end && open:
			// A start without an end before the next start: the kernel
			// does not hold that; read the first as a single address.
			out = append(out, rangePrefixes(start, start)...)
			start = b.addr
		case !b.end:
			start, open = b.addr, true
		case open:
			if b.addr == start {
				return nil, fmt.Errorf("empty interval at %s", start)
			}
			out = append(out, rangePrefixes(start, b.addr.Prev())...)
			open = false
		default:
			// An end with no start: nft's marker of the gap before the
			// first interval (0.0.0.0 flagged as end). Nothing to add.
		}
	}
	if open {
		last := netip.IPv4Unspecified()
		if start.Is6() {
			last = netip.IPv6Unspecified()
		}
		last = lastAddr(netip.PrefixFrom(last, 0))
		out = append(out, rangePrefixes(start, last)...)
	}
	return out, nil
}

// rangePrefixes returns the fewest prefixes that cover first..last exactly.
func rangePrefixes(first, last netip.Addr) []netip.Prefix {
	var out []netip.Prefix
	for {
		// The widest prefix starting at first that ends at or before last.
		var p netip.Prefix
		for bits := 0; bits <= first.BitLen(); bits++ {
			p = netip.PrefixFrom(first, bits)
			if p.Masked().Addr() == first && lastAddr(p).Compare(last) <= 0 {
				break
			}
		}
		out = append(out, p)
		end := lastAddr(p)
		if bits := p.Bits(); bits == first.BitLen() {
			end = first
		}
		if end.Compare(last) >= 0 {
			return out
		}
		first = end.Next()
	}
}

// rules dumps a chain's rules. It reads the netlink messages itself:
// google/nftables v0.3.0 fails a whole GetRules on a byteorder expression
// (which --to-ports rules hold), and drops expressions it does not know.
func (a *Applier) rules(chain string) ([]*nftables.Rule, error) {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: a.NetNS})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	data, err := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_RULE_TABLE, Data: cstring(TableName)},
		{Type: unix.NFTA_RULE_CHAIN, Data: cstring(chain)},
	})
	if err != nil {
		return nil, err
	}
	msgs, err := conn.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETRULE),
			Flags: netlink.Request | netlink.Dump},
		Data: append(nfgenmsg(unix.NFPROTO_INET, 0), data...),
	})
	if err != nil {
		return nil, err
	}
	var out []*nftables.Rule
	for _, m := range msgs {
		if m.Header.Type != netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWRULE) || len(m.Data) < 4 {
			continue
		}
		r, ruleChain, err := decodeRuleMessage(m.Data[4:])
		if err != nil {
			return nil, err
		}
		if ruleChain == chain {
			out = append(out, r)
		}
	}
	return out, nil
}

// unknownPrefix names, in an *expr.Match, an expression that
// google/nftables cannot decode: nothing here evaluates it or takes the
// rule for the agent's.
const unknownPrefix = "unknown expression "

// decodeRuleMessage decodes a rule message's attributes (after the
// nfgenmsg header): its expressions, comment and chain. An expression
// that google/nftables cannot decode becomes an *expr.Match named
// unknownPrefix + its name.
func decodeRuleMessage(data []byte) (*nftables.Rule, string, error) {
	r := &nftables.Rule{}
	var chain string
	ad, err := netlink.NewAttributeDecoder(data)
	if err != nil {
		return nil, "", err
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		switch ad.Type() &^ unix.NLA_F_NESTED {
		case unix.NFTA_RULE_CHAIN:
			chain = ad.String()
		case unix.NFTA_RULE_USERDATA:
			r.UserData = ad.Bytes()
		case unix.NFTA_RULE_EXPRESSIONS:
			ad.Nested(func(list *netlink.AttributeDecoder) error {
				for list.Next() {
					list.Nested(func(e *netlink.AttributeDecoder) error {
						var name string
						hasData := false
						for e.Next() {
							switch e.Type() &^ unix.NLA_F_NESTED {
							case unix.NFTA_EXPR_NAME:
								name = e.String()
							case unix.NFTA_EXPR_DATA:
								hasData = true
								x, err := decodeExpr(name, e.Bytes())
								if err != nil {
									return fmt.Errorf("expression %s: %w", name, err)
								}
								r.Exprs = append(r.Exprs, x)
							}
						}
						if !hasData { // an expression without data (notrack, ...)
							r.Exprs = append(r.Exprs, &expr.Match{Name: unknownPrefix + name})
						}
						return nil
					})
				}
				return nil
			})
		}
	}
	return r, chain, ad.Err()
}

// decodeExpr decodes one expression's data.
func decodeExpr(name string, data []byte) (expr.Any, error) {
	var e expr.Any
	switch name {
	case "byteorder": // google/nftables v0.3.0 cannot
		ad, err := netlink.NewAttributeDecoder(data)
		if err != nil {
			return nil, err
		}
		ad.ByteOrder = binary.BigEndian
		b := &expr.Byteorder{}
		for ad.Next() {
			switch ad.Type() {
			case unix.NFTA_BYTEORDER_SREG:
				b.SourceRegister = ad.Uint32()
			case unix.NFTA_BYTEORDER_DREG:
				b.DestRegister = ad.Uint32()
			case unix.NFTA_BYTEORDER_OP:
				b.Op = expr.ByteorderOp(ad.Uint32())
			case unix.NFTA_BYTEORDER_LEN:
				b.Len = ad.Uint32()
			case unix.NFTA_BYTEORDER_SIZE:
				b.Size = ad.Uint32()
			}
		}
		return b, ad.Err()
	case "fib":
		e = &expr.Fib{}
	case "cmp":
		e = &expr.Cmp{}
	case "meta":
		e = &expr.Meta{}
	case "payload":
		e = &expr.Payload{}
	case "lookup":
		e = &expr.Lookup{}
	case "numgen":
		e = &expr.Numgen{}
	case "counter":
		e = &expr.Counter{}
	case "immediate":
		e = &expr.Immediate{}
	case "masq":
		e = &expr.Masq{}
	case "nat":
		e = &expr.NAT{}
	case "bitwise":
		e = &expr.Bitwise{}
	case "range":
		e = &expr.Range{}
	case "ct":
		e = &expr.Ct{}
	default:
		return &expr.Match{Name: unknownPrefix + name}, nil
	}
	if err := expr.Unmarshal(unix.NFPROTO_INET, data, e); err != nil {
		return nil, err
	}
	// A verdict is an immediate that writes the verdict register.
	if imm, ok := e.(*expr.Immediate); ok && imm.Register == unix.NFT_REG_VERDICT && len(imm.Data) == 0 {
		e = &expr.Verdict{}
		if err := expr.Unmarshal(unix.NFPROTO_INET, data, e); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// kernelRule decodes a rule read from the kernel.
func kernelRule(r *nftables.Rule) KernelRule {
	comment, _ := userdata.GetString(r.UserData, userdata.TypeComment)
	kr := KernelRule{exprs: r.Exprs}
	if rule, ok := decodeRule(r.Exprs, comment); ok {
		kr.Rule = &rule
		kr.Text = RenderRule(rule)
		return kr
	}
	kr.Text = describeExprs(r.Exprs)
	if comment != "" {
		kr.Text += fmt.Sprintf(" comment %q", comment)
	}
	return kr
}

// decodeRule reads back a rule that ruleMessage encoded: exactly its
// expressions, in its order, or ok is false.
func decodeRule(exprs []expr.Any, comment string) (r Rule, ok bool) {
	r.Comment = comment
	i := 0
	peek := func() expr.Any {
		if i < len(exprs) {
			return exprs[i]
		}
		return nil
	}
	cmp := func(op expr.CmpOp, data []byte) bool {
		c, ok := peek().(*expr.Cmp)
		if ok && c.Op == op && c.Register == 1 && bytes.Equal(c.Data, data) {
			i++
			return true
		}
		return false
	}
	if f, ok := peek().(*expr.Fib); ok {
		i++
		if *f != (expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true}) ||
			!cmp(expr.CmpOpNeq, binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)) {
			return r, false
		}
		r.NotLocal = true
	}
	if m, ok := peek().(*expr.Meta); ok && m.Key == expr.MetaKeyNFPROTO && m.Register == 1 && !m.SourceRegister {
		i++
		switch {
		case cmp(expr.CmpOpEq, []byte{unix.NFPROTO_IPV4}):
			r.Family = 4
		case cmp(expr.CmpOpEq, []byte{unix.NFPROTO_IPV6}):
			r.Family = 6
		default:
			return r, false
		}
	}
	if p, ok := peek().(*expr.Payload); ok {
		i++
		want := expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4}
		if r.Family == 6 {
			want.Offset, want.Len = 24, 16
		}
		l, ok := peek().(*expr.Lookup)
		if r.Family == 0 || *p != want || !ok || l.SourceRegister != 1 || l.IsDestRegSet || l.Invert || l.SetName == "" {
			return r, false
		}
		i++
		r.DaddrSet = l.SetName
	}
	if m, ok := peek().(*expr.Meta); ok && m.Key == expr.MetaKeyL4PROTO && m.Register == 1 && !m.SourceRegister {
		i++
		c, ok := peek().(*expr.Cmp)
		if !ok || c.Op != expr.CmpOpEq || c.Register != 1 || len(c.Data) != 1 || c.Data[0] == 0 {
			return r, false
		}
		i++
		r.L4Proto = c.Data[0]
	}
	if n, ok := peek().(*expr.Numgen); ok {
		i++
		b, ok1 := peek().(*expr.Byteorder)
		if ok1 {
			i++
		}
		c, ok2 := peek().(*expr.Cmp)
		if !ok1 || !ok2 || n.Register != 1 || n.Type != unix.NFT_NG_RANDOM || n.Offset != 0 ||
			*b != (expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Len: 4, Size: 4}) ||
			c.Op != expr.CmpOpLt || c.Register != 1 || len(c.Data) != 4 {
			return r, false
		}
		i++
		r.Share = &Share{Below: uint32(c.Data[0])<<24 | uint32(c.Data[1])<<16 | uint32(c.Data[2])<<8 | uint32(c.Data[3]), Of: n.Modulus}
	}
	if _, ok := peek().(*expr.Counter); !ok {
		return r, false
	}
	i++
	switch v := peek().(type) {
	case *expr.Verdict:
		i++
		switch v.Kind {
		case expr.VerdictReturn:
			r.Verdict = Return
		case expr.VerdictJump:
			r.Verdict, r.Target = Jump, v.Chain
		case expr.VerdictGoto:
			r.Verdict, r.Target = Goto, v.Chain
		default:
			return r, false
		}
	case *expr.Immediate, *expr.Masq:
		var ports *PortRange
		if lo, ok := v.(*expr.Immediate); ok {
			i++
			hi, ok := peek().(*expr.Immediate)
			if !ok || lo.Register != 1 || hi.Register != 2 || len(lo.Data) != 2 || len(hi.Data) != 2 {
				return r, false
			}
			i++
			ports = &PortRange{First: uint16(lo.Data[0])<<8 | uint16(lo.Data[1]), Last: uint16(hi.Data[0])<<8 | uint16(hi.Data[1])}
		}
		m, ok := peek().(*expr.Masq)
		if !ok || m.Random || m.Persistent || m.ToPorts != (ports != nil) ||
			(ports != nil && (m.RegProtoMin != 1 || m.RegProtoMax != 2)) {
			return r, false
		}
		i++
		r.Verdict, r.Ports, r.FullyRandom = Masquerade, ports, m.FullyRandom
	default:
		return r, false
	}
	return r, i == len(exprs)
}

// describeExprs writes a rule that the model cannot express in a syntax
// close to nft's, for diff and explain: enough to recognise it.
func describeExprs(exprs []expr.Any) string {
	var w []string
	field := "" // what the last load put in register 1, for showing data
	show := func(data []byte) string {
		if a, ok := netip.AddrFromSlice(data); ok && strings.Contains(field, "addr") {
			return a.String()
		}
		if len(data) == 1 && field == "meta nfproto" {
			switch data[0] {
			case unix.NFPROTO_IPV4:
				return "ipv4"
			case unix.NFPROTO_IPV6:
				return "ipv6"
			}
		}
		if len(data) == 2 && strings.HasPrefix(field, "th ") {
			return fmt.Sprint(uint16(data[0])<<8 | uint16(data[1]))
		}
		if len(data) == 1 && field == "meta l4proto" {
			return protoName(data[0])
		}
		return fmt.Sprintf("0x%x", data)
	}
	for _, e := range exprs {
		switch e := e.(type) {
		case *expr.Meta:
			field = "meta " + metaName(e.Key)
			w = append(w, field)
		case *expr.Payload:
			field = payloadName(e)
			w = append(w, field)
		case *expr.Fib:
			field = "fib daddr type"
			w = append(w, field)
		case *expr.Cmp:
			op := map[expr.CmpOp]string{expr.CmpOpEq: "", expr.CmpOpNeq: "!= ", expr.CmpOpLt: "< ",
				expr.CmpOpLte: "<= ", expr.CmpOpGt: "> ", expr.CmpOpGte: ">= "}[e.Op]
			w = append(w, op+show(e.Data))
		case *expr.Bitwise:
			w = append(w, "& "+show(e.Mask))
		case *expr.Range:
			w = append(w, show(e.FromData)+"-"+show(e.ToData))
		case *expr.Lookup:
			if e.Invert {
				w = append(w, "!= @"+e.SetName)
			} else {
				w = append(w, "@"+e.SetName)
			}
		case *expr.Counter:
			w = append(w, "counter")
		case *expr.Verdict:
			w = append(w, verdictName(e))
		case *expr.Masq:
			w = append(w, "masquerade")
		case *expr.NAT:
			w = append(w, "nat")
		case *expr.Immediate:
		case *expr.Match:
			w = append(w, strings.TrimPrefix(e.Name, unknownPrefix))
		default:
			w = append(w, strings.ToLower(strings.TrimPrefix(fmt.Sprintf("%T", e), "*expr.")))
		}
	}
	return strings.Join(w, " ")
}

func metaName(k expr.MetaKey) string {
	switch k {
	case expr.MetaKeyNFPROTO:
		return "nfproto"
	case expr.MetaKeyL4PROTO:
		return "l4proto"
	case expr.MetaKeyMARK:
		return "mark"
	case expr.MetaKeyIIFNAME:
		return "iifname"
	case expr.MetaKeyOIFNAME:
		return "oifname"
	}
	return fmt.Sprintf("key %d", k)
}

func payloadName(p *expr.Payload) string {
	if p.Base == expr.PayloadBaseNetworkHeader {
		switch {
		case p.Offset == 12 && p.Len == 4:
			return "ip saddr"
		case p.Offset == 16 && p.Len == 4:
			return "ip daddr"
		case p.Offset == 8 && p.Len == 16:
			return "ip6 saddr"
		case p.Offset == 24 && p.Len == 16:
			return "ip6 daddr"
		}
	}
	if p.Base == expr.PayloadBaseTransportHeader && p.Len == 2 && (p.Offset == 0 || p.Offset == 2) {
		return map[uint32]string{0: "th sport", 2: "th dport"}[p.Offset]
	}
	base := map[expr.PayloadBase]string{expr.PayloadBaseLLHeader: "ll", expr.PayloadBaseNetworkHeader: "nh",
		expr.PayloadBaseTransportHeader: "th"}[p.Base]
	return fmt.Sprintf("@%s,%d,%d", base, p.Offset*8, p.Len*8)
}

func verdictName(v *expr.Verdict) string {
	switch v.Kind {
	case expr.VerdictReturn:
		return "return"
	case expr.VerdictJump:
		return "jump " + v.Chain
	case expr.VerdictGoto:
		return "goto " + v.Chain
	case expr.VerdictAccept:
		return "accept"
	case expr.VerdictDrop:
		return "drop"
	}
	return fmt.Sprintf("verdict %d", v.Kind)
}

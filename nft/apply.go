package nft

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Applier makes the kernel's table inet ip-masq-agent hold a Ruleset. It is
// the only code that talks to the kernel.
type Applier struct {
	// NetNS is a file descriptor of the network namespace to program;
	// 0 means the caller's own.
	NetNS int
}

// Result says what an Apply did.
type Result struct {
	Created  bool // the table was (re-)created whole, not replaced in place
	Messages int  // netlink messages in the transaction
	Bytes    int  // their size
}

// Apply replaces the table's contents with rs in one netlink transaction:
// either all of rs is in force afterwards or, on error, all of the old state.
//
// When the table exists with the agent's shape (the same sets and chains),
// its sets and chains are flushed and refilled in place. Deleting and
// re-creating the table, even inside one transaction, let 2-6% of new
// connections to non-masquerade destinations be masqueraded during swaps
// (measured on kernel 6.18): so that is done only when the table is missing
// or its shape is wrong.
func (a *Applier) Apply(rs Ruleset) (Result, error) {
	exists, sameShape, err := a.inspect(rs)
	if err != nil {
		return Result{}, fmt.Errorf("apply table inet %s: read the current table: %w", TableName, err)
	}
	b := newBatch()
	o := objectsFor(rs)
	if sameShape {
		for _, c := range o.chains {
			b.add("flush chain "+c.Name, func(cc *nftables.Conn) error { cc.FlushChain(c); return nil })
		}
		for _, s := range o.sets {
			b.add("flush set "+s.Name, func(cc *nftables.Conn) error { cc.FlushSet(s); return nil })
		}
	} else {
		if exists {
			b.add("delete the table, whose sets or chains are not the agent's",
				func(cc *nftables.Conn) error { cc.DelTable(o.table); return nil })
		}
		b.add("add table", func(cc *nftables.Conn) error { cc.AddTable(o.table); return nil })
		for _, s := range o.sets {
			b.add("add set "+s.Name, func(cc *nftables.Conn) error { return cc.AddSet(s, nil) })
		}
		for _, c := range o.chains {
			b.add("add chain "+c.Name, func(cc *nftables.Conn) error { cc.AddChain(c); return nil })
		}
	}
	for i, rules := range [][]Rule{rs.Base, rs.Rules, rs.Masq} {
		chain := o.chains[i].Name
		for _, r := range rules {
			msg, err := ruleMessage(chain, r)
			if err != nil {
				return Result{}, fmt.Errorf("apply table inet %s: encode rule %q: %w", TableName, RenderRule(r), err)
			}
			b.addMessage(fmt.Sprintf("add rule to chain %s: %s", chain, RenderRule(r)), msg)
		}
	}
	for i, s := range rs.Sets {
		set := o.sets[i]
		for start := 0; start < len(s.Prefixes); start += elementsPerMessage {
			chunk := s.Prefixes[start:min(start+elementsPerMessage, len(s.Prefixes))]
			what := fmt.Sprintf("add elements %d-%d of %d to set %s", start+1, start+len(chunk), len(s.Prefixes), s.Name)
			b.add(what, func(cc *nftables.Conn) error { return cc.SetAddElements(set, intervals(chunk)) })
		}
	}
	if b.err != nil {
		// Never send a batch after a builder error.
		return Result{}, fmt.Errorf("apply table inet %s: %w", TableName, b.err)
	}
	res := Result{Created: !sameShape, Messages: len(b.msgs), Bytes: b.size()}
	if err := b.send(a.NetNS); err != nil {
		return res, fmt.Errorf("apply table inet %s: %w", TableName, err)
	}
	return res, nil
}

// Delete removes the agent's table; it is not an error if there is none.
func (a *Applier) Delete() error {
	exists, _, err := a.inspect(Ruleset{})
	if err != nil || !exists {
		return err
	}
	b := newBatch()
	b.add("delete table", func(cc *nftables.Conn) error {
		cc.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: TableName})
		return nil
	})
	if err := b.send(a.NetNS); err != nil {
		return fmt.Errorf("delete table inet %s: %w", TableName, err)
	}
	return nil
}

// elementsPerMessage bounds one NEWSETELEM message well below 64 KiB: a
// netlink attribute's length is 16 bits, and google/nftables v0.3.0 lets a
// larger element list wrap silently, so the kernel keeps a fragment of the
// set while the batch succeeds. 512 IPv6 intervals take about 36 KiB.
const elementsPerMessage = 512

// intervals encodes prefixes as interval-set elements: the first address,
// and the address after the last flagged as interval end. A prefix that
// reaches the top of the address space (0.0.0.0/0, 240.0.0.0/4, ::/0) has no
// address after it and gets no end element, as nft does.
func intervals(ps []netip.Prefix) []nftables.SetElement {
	out := make([]nftables.SetElement, 0, 2*len(ps))
	for _, p := range ps {
		out = append(out, nftables.SetElement{Key: p.Addr().AsSlice()})
		last := p.Addr()
		if bits := p.Bits(); bits < last.BitLen() {
			last = lastAddr(p)
		}
		if end := last.Next(); end.IsValid() {
			out = append(out, nftables.SetElement{Key: end.AsSlice(), IntervalEnd: true})
		}
	}
	return out
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// objects are the google/nftables values of the table, its sets (in
// Ruleset.Sets order) and its chains (base, decision, masquerade).
type objects struct {
	table  *nftables.Table
	sets   []*nftables.Set
	chains []*nftables.Chain
}

func objectsFor(rs Ruleset) objects {
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}
	o := objects{table: t}
	for _, s := range rs.Sets {
		key := nftables.TypeIPAddr
		if s.Family == 6 {
			key = nftables.TypeIP6Addr
		}
		o.sets = append(o.sets, &nftables.Set{Table: t, Name: s.Name, KeyType: key, Interval: true,
			KeyByteOrder: binaryutil.BigEndian, Comment: s.Comment})
	}
	accept := nftables.ChainPolicyAccept
	o.chains = []*nftables.Chain{
		{Table: t, Name: BaseChainName, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPostrouting,
			Priority: nftables.ChainPriorityRef(Priority), Policy: &accept},
		{Table: t, Name: rs.Chain},
		{Table: t, Name: MasqChainName},
	}
	return o
}

// inspect reports whether the table exists and whether its sets and chains
// are exactly those rs needs (so that they can be refilled in place).
func (a *Applier) inspect(rs Ruleset) (exists, sameShape bool, err error) {
	c, err := nftables.New(nftables.WithNetNSFd(a.NetNS))
	if err != nil {
		return false, false, err
	}
	t, err := c.ListTableOfFamily(TableName, nftables.TableFamilyINet)
	if errors.Is(err, os.ErrNotExist) {
		return false, false, nil
	}
	if err != nil {
		return false, false, fmt.Errorf("list table: %w", err)
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return true, false, fmt.Errorf("list chains: %w", err)
	}
	sets, err := c.GetSets(t)
	if err != nil {
		return true, false, fmt.Errorf("list sets: %w", err)
	}
	want := objectsFor(rs)
	var gotChains []string
	for _, ch := range chains {
		if ch.Table == nil || ch.Table.Name != TableName {
			continue
		}
		gotChains = append(gotChains, ch.Name)
		if ch.Name == BaseChainName && (ch.Hooknum == nil || *ch.Hooknum != *nftables.ChainHookPostrouting ||
			ch.Priority == nil || *ch.Priority != Priority || ch.Type != nftables.ChainTypeNAT) {
			return true, false, nil
		}
	}
	var wantChains []string
	for _, ch := range want.chains {
		wantChains = append(wantChains, ch.Name)
	}
	if !sameNames(gotChains, wantChains) || len(sets) != len(want.sets) {
		return true, false, nil
	}
	for _, w := range want.sets {
		i := slices.IndexFunc(sets, func(s *nftables.Set) bool { return s.Name == w.Name })
		if i < 0 || !sets[i].Interval || sets[i].KeyType.Name != w.KeyType.Name || sets[i].IsMap {
			return true, false, nil
		}
	}
	return true, true, nil
}

func sameNames(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// ruleMessage encodes a NEWRULE message. Rules are encoded here rather than
// with nftables.Conn.AddRule because expr.Masq of google/nftables v0.3.0
// drops fully-random when it has a port range, and AddRule asks the kernel
// to echo every rule back.
func ruleMessage(chain string, r Rule) (netlink.Message, error) {
	var exprs []expr.Any
	if r.NotLocal {
		// fib's address type is a host-endian u32 (RTN_LOCAL is 2).
		exprs = append(exprs,
			&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)})
	}
	if r.Family != 0 {
		proto := byte(unix.NFPROTO_IPV4)
		if r.Family == 6 {
			proto = unix.NFPROTO_IPV6
		}
		exprs = append(exprs,
			&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}})
	}
	if r.DaddrSet != "" {
		offset, size := uint32(16), uint32(4) // IPv4 header's daddr
		if r.Family == 6 {
			offset, size = 24, 16
		}
		exprs = append(exprs,
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: size},
			&expr.Lookup{SourceRegister: 1, SetName: r.DaddrSet})
	}
	if r.L4Proto != 0 {
		exprs = append(exprs,
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{r.L4Proto}})
	}
	if r.Share != nil {
		// numgen yields a host-endian u32; cmp lt compares bytes, so
		// convert to network order first, as nft does.
		exprs = append(exprs,
			&expr.Numgen{Register: 1, Modulus: r.Share.Of, Type: unix.NFT_NG_RANDOM},
			&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Len: 4, Size: 4},
			&expr.Cmp{Op: expr.CmpOpLt, Register: 1, Data: binaryutil.BigEndian.PutUint32(r.Share.Below)})
	}
	// The counter goes before the verdict: after masquerade it never counts.
	exprs = append(exprs, &expr.Counter{})
	switch r.Verdict {
	case Return:
		exprs = append(exprs, &expr.Verdict{Kind: expr.VerdictReturn})
	case Jump:
		exprs = append(exprs, &expr.Verdict{Kind: expr.VerdictJump, Chain: r.Target})
	case Goto:
		exprs = append(exprs, &expr.Verdict{Kind: expr.VerdictGoto, Chain: r.Target})
	case Masquerade:
		if r.Ports != nil {
			exprs = append(exprs,
				&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(r.Ports.First)},
				&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(r.Ports.Last)})
		}
	default:
		return netlink.Message{}, fmt.Errorf("unknown verdict %d", r.Verdict)
	}

	var list []netlink.Attribute
	for _, e := range exprs {
		b, err := expr.Marshal(unix.NFPROTO_INET, e)
		if err != nil {
			return netlink.Message{}, err
		}
		list = append(list, netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_LIST_ELEM, Data: b})
	}
	if r.Verdict == Masquerade {
		b, err := masqExpr(r)
		if err != nil {
			return netlink.Message{}, err
		}
		list = append(list, netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_LIST_ELEM, Data: b})
	}
	exprList, err := netlink.MarshalAttributes(list)
	if err != nil {
		return netlink.Message{}, err
	}
	data, err := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_RULE_TABLE, Data: cstring(TableName)},
		{Type: unix.NFTA_RULE_CHAIN, Data: cstring(chain)},
		{Type: unix.NLA_F_NESTED | unix.NFTA_RULE_EXPRESSIONS, Data: exprList},
		{Type: unix.NFTA_RULE_USERDATA, Data: userdata.AppendString(nil, userdata.TypeComment, r.Comment)},
	})
	if err != nil {
		return netlink.Message{}, err
	}
	return netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWRULE),
			Flags: netlink.Request | netlink.Create | unix.NLM_F_APPEND,
		},
		Data: append(nfgenmsg(unix.NFPROTO_INET, 0), data...),
	}, nil
}

// masqExpr encodes `masquerade [to :min-max] [fully-random]` with the port
// range in registers 1 and 2, flags included (see ruleMessage).
func masqExpr(r Rule) ([]byte, error) {
	var flags uint32
	var attrs []netlink.Attribute
	if r.FullyRandom {
		flags |= unix.NF_NAT_RANGE_PROTO_RANDOM_FULLY
	}
	if r.Ports != nil {
		flags |= unix.NF_NAT_RANGE_PROTO_SPECIFIED
		attrs = append(attrs,
			netlink.Attribute{Type: unix.NFTA_MASQ_REG_PROTO_MIN, Data: binaryutil.BigEndian.PutUint32(1)},
			netlink.Attribute{Type: unix.NFTA_MASQ_REG_PROTO_MAX, Data: binaryutil.BigEndian.PutUint32(2)})
	}
	if flags != 0 {
		attrs = append(attrs, netlink.Attribute{Type: unix.NFTA_MASQ_FLAGS, Data: binaryutil.BigEndian.PutUint32(flags)})
	}
	data, err := netlink.MarshalAttributes(attrs)
	if err != nil {
		return nil, err
	}
	return netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_EXPR_NAME, Data: cstring("masq")},
		{Type: unix.NLA_F_NESTED | unix.NFTA_EXPR_DATA, Data: data},
	})
}

func cstring(s string) []byte { return append([]byte(s), 0) }

// nfgenmsg is the header of every nftables message: family, version, resource id.
func nfgenmsg(family uint8, resID uint16) []byte {
	return append([]byte{family, unix.NFNETLINK_V0}, binaryutil.BigEndian.PutUint16(resID)...)
}

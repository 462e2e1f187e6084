package kernel

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"

	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// Rules as the kernel lists them, decoded by hand: google/nftables v0.3.0
// fails a whole GetRules on a byteorder expression (which --to-ports rules
// hold), and drops expressions it does not know.

// decodeRules decodes a rule dump, by chain.
func decodeRules(msgs []netlink.Message) (map[string][]nft.Rule, error) {
	out := map[string][]nft.Rule{}
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		r, chain, err := decodeRuleMessage(m.Data[4:])
		if err != nil {
			return nil, err
		}
		out[chain] = append(out[chain], r)
	}
	return out, nil
}

// decodeRuleMessage decodes a rule message's attributes (after the
// nfgenmsg header): its expressions, comment and chain. An expression
// that google/nftables cannot decode becomes an *expr.Match named
// nft.UnknownPrefix + its name.
func decodeRuleMessage(data []byte) (nft.Rule, string, error) {
	d, err := decodeRuleAttrs(data, unix.NFPROTO_INET)
	if err != nil {
		return nft.Rule{}, "", err
	}
	comment, _ := userdata.GetString(d.userData, userdata.TypeComment)
	r := nft.FoundRule(d.exprs, comment)
	if r.Foreign == "" && !sameEncoding(d.raw, r) {
		// google/nftables' decoders drop what they do not know (a masq
		// expression's other flags, say): what decodes as the agent's
		// rule must also be encoded exactly as the agent encodes it.
		r.Foreign = nft.RenderRule(r) + " # its expressions differ from the agent's encoding"
	}
	return r, d.chain, nil
}

// rawExpr is an expression as the kernel sent it.
type rawExpr struct {
	name string
	data []byte // NFTA_EXPR_DATA
}

// sameEncoding reports whether the kernel's expressions of a rule are the
// agent's encoding of r, attribute by attribute (an attribute one side
// leaves out equals a zero value on the other), counters' values aside.
func sameEncoding(raw []rawExpr, r nft.Rule) bool {
	want := r.Encode()
	if len(raw) != len(want) {
		return false
	}
	for i, e := range want {
		b, err := marshalExpr(e)
		if err != nil {
			return false
		}
		var name string
		var data []byte
		walkAttrs(b, func(typ uint16, v []byte) bool {
			switch typ {
			case unix.NFTA_EXPR_NAME:
				name = strings.TrimRight(string(v), "\x00")
			case unix.NFTA_EXPR_DATA:
				data = v
			}
			return true
		})
		if name != raw[i].name {
			return false
		}
		got := raw[i].data
		if name == "nat" {
			got = withoutMapIPs(got)
		}
		if name != "counter" && !sameAttrs(got, data) {
			return false
		}
	}
	return true
}

// withoutMapIPs returns a nat expression's attributes with
// NF_NAT_RANGE_MAP_IPS cleared from its flags: the kernel sets that flag
// itself for a nat with an address register (nft_nat_init), and
// google/nftables cannot send it (expr.NAT has no field for it).
func withoutMapIPs(data []byte) []byte {
	out := slices.Clone(data)
	for b := out; len(b) >= 4; {
		n := int(binary.NativeEndian.Uint16(b))
		if n < 4 || n > len(b) {
			return data
		}
		if binary.NativeEndian.Uint16(b[2:])&^unix.NLA_F_NESTED == unix.NFTA_NAT_FLAGS && n == 8 {
			f := binary.BigEndian.Uint32(b[4:8]) &^ unix.NF_NAT_RANGE_MAP_IPS
			binary.BigEndian.PutUint32(b[4:8], f)
		}
		b = b[min((n+3)&^3, len(b)):]
	}
	return out
}

// sameAttrs compares two attribute lists by type, nested ones recursively;
// an attribute missing on one side equals one of zero bytes on the other.
func sameAttrs(a, b []byte) bool {
	type attr struct {
		nested bool
		v      []byte
	}
	parse := func(b []byte) (map[uint16]attr, bool) {
		m := map[uint16]attr{}
		ok := len(b) == 0 || walkAttrsFlags(b, func(typ uint16, nested bool, v []byte) bool {
			m[typ] = attr{nested, v}
			return true
		})
		return m, ok
	}
	ma, ok1 := parse(a)
	mb, ok2 := parse(b)
	if !ok1 || !ok2 {
		return bytes.Equal(a, b)
	}
	zero := func(v []byte) bool { return !slices.ContainsFunc(v, func(c byte) bool { return c != 0 }) }
	for t, x := range ma {
		y, ok := mb[t]
		switch {
		case !ok:
			if !zero(x.v) {
				return false
			}
		case x.nested || y.nested:
			if !sameAttrs(x.v, y.v) {
				return false
			}
		case !bytes.Equal(x.v, y.v):
			return false
		}
	}
	for t, y := range mb {
		if _, ok := ma[t]; !ok && !zero(y.v) {
			return false
		}
	}
	return true
}

// ruleAttrs are the attributes of a rule message.
type ruleAttrs struct {
	chain    string
	handle   uint64
	userData []byte
	exprs    []expr.Any
	raw      []rawExpr
}

// decodeRuleAttrs decodes a rule message of family fam (after the nfgenmsg
// header). The family matters for xtables matches and targets (iptables-nft's
// rules), whose info depends on it.
func decodeRuleAttrs(data []byte, fam byte) (ruleAttrs, error) {
	var r ruleAttrs
	ad, err := netlink.NewAttributeDecoder(data)
	if err != nil {
		return r, err
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		switch ad.Type() &^ unix.NLA_F_NESTED {
		case unix.NFTA_RULE_CHAIN:
			r.chain = ad.String()
		case unix.NFTA_RULE_HANDLE:
			r.handle = ad.Uint64()
		case unix.NFTA_RULE_USERDATA:
			r.userData = ad.Bytes()
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
								r.raw = append(r.raw, rawExpr{name, e.Bytes()})
								x, err := decodeExprFamily(fam, name, e.Bytes())
								if err != nil {
									return fmt.Errorf("expression %s: %w", name, err)
								}
								r.exprs = append(r.exprs, x)
							}
						}
						if !hasData { // an expression without data (notrack, ...)
							r.exprs = append(r.exprs, &expr.Match{Name: nft.UnknownPrefix + name})
							r.raw = append(r.raw, rawExpr{name: name})
						}
						return nil
					})
				}
				return nil
			})
		}
	}
	if err := ad.Err(); err != nil {
		return ruleAttrs{}, err
	}
	return r, nil
}

// exprDecoders is every expression google/nftables v0.3.0 decodes, by its
// kernel name (its own table, exprFromName, is not exported): a rule
// statement the agent adds later (a log, a mark) reads back as itself,
// not as an unknown expression, with no change here.
var exprDecoders = map[string]func() expr.Any{
	"bitwise": func() expr.Any { return &expr.Bitwise{} }, "cmp": func() expr.Any { return &expr.Cmp{} },
	"connlimit": func() expr.Any { return &expr.Connlimit{} }, "counter": func() expr.Any { return &expr.Counter{} },
	"ct": func() expr.Any { return &expr.Ct{} }, "dynset": func() expr.Any { return &expr.Dynset{} },
	"exthdr": func() expr.Any { return &expr.Exthdr{} }, "fib": func() expr.Any { return &expr.Fib{} },
	"hash": func() expr.Any { return &expr.Hash{} }, "immediate": func() expr.Any { return &expr.Immediate{} },
	"limit": func() expr.Any { return &expr.Limit{} }, "log": func() expr.Any { return &expr.Log{} },
	"lookup": func() expr.Any { return &expr.Lookup{} }, "masq": func() expr.Any { return &expr.Masq{} },
	"meta": func() expr.Any { return &expr.Meta{} }, "nat": func() expr.Any { return &expr.NAT{} },
	"numgen": func() expr.Any { return &expr.Numgen{} }, "objref": func() expr.Any { return &expr.Objref{} },
	"payload": func() expr.Any { return &expr.Payload{} }, "queue": func() expr.Any { return &expr.Queue{} },
	"quota": func() expr.Any { return &expr.Quota{} }, "range": func() expr.Any { return &expr.Range{} },
	"redir": func() expr.Any { return &expr.Redir{} }, "reject": func() expr.Any { return &expr.Reject{} },
	"secmark": func() expr.Any { return &expr.SecMark{} }, "synproxy": func() expr.Any { return &expr.SynProxy{} },
	// an xtables match or target (iptables-nft): its name and info
	"match": func() expr.Any { return &expr.Match{} }, "target": func() expr.Any { return &expr.Target{} },
}

// decodeExprFamily decodes one expression's data in a table of family fam.
func decodeExprFamily(fam byte, name string, data []byte) (expr.Any, error) {
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
	default:
		newExpr, ok := exprDecoders[name]
		if !ok {
			return &expr.Match{Name: nft.UnknownPrefix + name}, nil
		}
		e = newExpr()
	}
	if err := expr.Unmarshal(fam, data, e); err != nil {
		// Data google/nftables cannot read (an xtables info blob, a
		// newer kernel's attribute): a rule the agent did not write, which
		// the plan replaces; the read goes on. A target stays a target:
		// the rule still decides something, which the evaluator cannot tell.
		if name == "target" {
			return &expr.Target{Name: nft.UnknownPrefix + name}, nil
		}
		return &expr.Match{Name: nft.UnknownPrefix + name}, nil
	}
	// A verdict is an immediate that writes the verdict register.
	if imm, ok := e.(*expr.Immediate); ok && imm.Register == unix.NFT_REG_VERDICT && len(imm.Data) == 0 {
		e = &expr.Verdict{}
		if err := expr.Unmarshal(fam, data, e); err != nil {
			return nil, err
		}
	}
	return e, nil
}

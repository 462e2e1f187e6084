package nft

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// unknownPrefix names, in an *expr.Match, an expression that
// google/nftables cannot decode: nothing here evaluates it or takes the
// rule for the agent's.
const unknownPrefix = "unknown expression "

// decodeRuleMessage decodes a rule message's attributes (after the
// nfgenmsg header): its expressions, comment and chain. An expression
// that google/nftables cannot decode becomes an *expr.Match named
// unknownPrefix + its name.
func decodeRuleMessage(data []byte) (Rule, string, error) {
	d, err := decodeRuleAttrs(data, unix.NFPROTO_INET)
	if err != nil {
		return Rule{}, "", err
	}
	r := foundRule(&nftables.Rule{Exprs: d.exprs, UserData: d.userData})
	if r.Foreign == "" && !sameEncoding(d.raw, r) {
		// google/nftables' decoders drop what they do not know (a masq
		// expression's other flags, say): what decodes as the agent's
		// rule must also be encoded exactly as the agent encodes it.
		r.Foreign = RenderRule(r) + " # its expressions differ from the agent's encoding"
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
func sameEncoding(raw []rawExpr, r Rule) bool {
	r.exprs = nil
	want := r.expressions()
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
		if name != "counter" && !sameAttrs(raw[i].data, data) {
			return false
		}
	}
	return true
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
							r.exprs = append(r.exprs, &expr.Match{Name: unknownPrefix + name})
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
	case "match": // an xtables match (iptables-nft): its name and info
		e = &expr.Match{}
	case "target": // an xtables target (iptables-nft)
		e = &expr.Target{}
	default:
		return &expr.Match{Name: unknownPrefix + name}, nil
	}
	if err := expr.Unmarshal(fam, data, e); err != nil {
		if name == "match" || name == "target" { // an info blob google/nftables cannot read
			return &expr.Match{Name: unknownPrefix + name}, nil
		}
		return nil, err
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

// foundRule is a rule read from the kernel in the model's terms: decoded
// exactly, or Foreign.
func foundRule(r *nftables.Rule) Rule {
	comment, _ := userdata.GetString(r.UserData, userdata.TypeComment)
	out, ok := decodeRule(r.Exprs, comment)
	if !ok {
		out = Rule{Foreign: describeExprs(r.Exprs)}
		if comment != "" {
			out.Foreign += fmt.Sprintf(" comment %q", comment)
		}
	}
	out.exprs = r.Exprs
	for _, e := range r.Exprs {
		if c, ok := e.(*expr.Counter); ok {
			out.Packets, out.Bytes = c.Packets, c.Bytes
		}
	}
	return out
}

// describeExprs writes a rule that the model cannot express in a syntax
// close to nft's, for diff and explain: enough to recognise it.
func describeExprs(exprs []expr.Any) string {
	var w []string
	field := ""  // what the last load put in register 1, for showing data
	partial := 0 // the load covers the first bytes of an address of this many bytes (iptables-nft's prefixes)
	var mask []byte
	show := func(data []byte) string {
		if partial > 0 {
			if p, ok := prefixText(data, mask, partial); ok {
				return p
			}
		}
		if strings.HasSuffix(field, "ifname") {
			return fmt.Sprintf("%q", strings.TrimRight(string(data), "\x00"))
		}
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
			field, partial, mask = "meta "+metaName(e.Key), 0, nil
			w = append(w, field)
		case *expr.Payload:
			field, partial, mask = payloadName(e), 0, nil
			if name, full := addrPrefixLoad(e); name != "" {
				field, partial = name, full
			}
			w = append(w, field)
		case *expr.Fib:
			field = "fib daddr type"
			w = append(w, field)
		case *expr.Cmp:
			op := map[expr.CmpOp]string{expr.CmpOpEq: "", expr.CmpOpNeq: "!= ", expr.CmpOpLt: "< ",
				expr.CmpOpLte: "<= ", expr.CmpOpGt: "> ", expr.CmpOpGte: ">= "}[e.Op]
			w = append(w, op+show(e.Data))
		case *expr.Bitwise:
			if full := addrLen(field); full > 0 &&
				len(e.Mask) <= full && bytes.Count(e.Xor, []byte{0}) == len(e.Xor) {
				partial, mask = full, e.Mask // shown with the comparison, as a prefix
				continue
			}
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
			if strings.HasPrefix(e.Name, unknownPrefix) {
				w = append(w, strings.TrimPrefix(e.Name, unknownPrefix))
			} else {
				w = append(w, xtText(e.Name, e.Info, false))
			}
		case *expr.Target:
			w = append(w, xtText(e.Name, e.Info, true))
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

// addrPrefixLoad names a load of the first bytes of an address (how
// iptables-nft matches a prefix), and the address's length.
func addrPrefixLoad(p *expr.Payload) (string, int) {
	if p.Base != expr.PayloadBaseNetworkHeader || p.Len == 0 {
		return "", 0
	}
	for _, a := range addrFields {
		if p.Offset == a.offset && p.Len < a.len && p.Len >= a.minPrefix {
			return a.name, int(a.len)
		}
	}
	return "", 0
}

// addrLen is the length of the address field nft names name; 0 for
// other fields.
func addrLen(name string) int {
	for _, a := range addrFields {
		if a.name == name {
			return int(a.len)
		}
	}
	return 0
}

func payloadName(p *expr.Payload) string {
	if p.Base == expr.PayloadBaseNetworkHeader {
		for _, a := range addrFields {
			if p.Offset == a.offset && p.Len == a.len {
				return a.name
			}
		}
	}
	if p.Base == expr.PayloadBaseTransportHeader && p.Len == 2 && (p.Offset == 0 || p.Offset == 2) {
		return map[uint32]string{0: "th sport", 2: "th dport"}[p.Offset]
	}
	base := map[expr.PayloadBase]string{expr.PayloadBaseLLHeader: "ll", expr.PayloadBaseNetworkHeader: "nh",
		expr.PayloadBaseTransportHeader: "th"}[p.Base]
	return fmt.Sprintf("@%s,%d,%d", base, p.Offset*8, p.Len*8)
}

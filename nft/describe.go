package nft

import (
	"bytes"
	"fmt"
	"math/bits"
	"net/netip"
	"strings"

	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
	"golang.org/x/sys/unix"
)

// FoundRule is a rule read from the kernel in the model's terms: decoded
// exactly, or Foreign.
func FoundRule(exprs []expr.Any, comment string) Rule {
	out, ok := decodeRule(exprs, comment)
	if !ok {
		out = Rule{Foreign: DescribeExprs(exprs)}
		if comment != "" {
			out.Foreign += fmt.Sprintf(" comment %q", comment)
		}
	}
	out.exprs = exprs
	for _, e := range exprs {
		if c, ok := e.(*expr.Counter); ok {
			out.Packets, out.Bytes = c.Packets, c.Bytes
		}
	}
	return out
}

// DescribeExprs writes a rule that the model cannot express in a syntax
// close to nft's, for diff and explain: enough to recognise it.
func DescribeExprs(exprs []expr.Any) string {
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
			if full := map[string]int{"ip saddr": 4, "ip daddr": 4, "ip6 saddr": 16, "ip6 daddr": 16}[field]; full > 0 &&
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
			w = append(w, VerdictName(e))
		case *expr.Masq:
			w = append(w, "masquerade")
		case *expr.NAT:
			w = append(w, "nat")
		case *expr.Immediate:
		case *expr.Match:
			if strings.HasPrefix(e.Name, UnknownPrefix) {
				w = append(w, strings.TrimPrefix(e.Name, UnknownPrefix))
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
	switch {
	case p.Offset == 12 && p.Len < 4:
		return "ip saddr", 4
	case p.Offset == 16 && p.Len < 4:
		return "ip daddr", 4
	case p.Offset == 8 && p.Len < 16 && p.Len > 4: // shorter: an IPv4 header's ttl and protocol
		return "ip6 saddr", 16
	case p.Offset == 24 && p.Len < 16:
		return "ip6 daddr", 16
	}
	return "", 0
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

func VerdictName(v *expr.Verdict) string {
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

// prefixText shows a comparison of part of an address (iptables-nft loads
// only the bytes a prefix covers, and masks the last one) as a prefix.
func prefixText(data, mask []byte, full int) (string, bool) {
	if len(data) == 0 || len(data) > full || (full != 4 && full != 16) {
		return "", false
	}
	addr := make([]byte, full)
	copy(addr, data)
	n := len(data) * 8
	if mask != nil {
		if len(mask) != len(data) {
			return "", false
		}
		n = 0
		for _, m := range mask {
			n += bits.OnesCount8(m)
		}
	}
	a, _ := netip.AddrFromSlice(addr)
	p := netip.PrefixFrom(a, n)
	if !p.IsValid() {
		return "", false
	}
	return p.String(), true
}

// UnknownPrefix names, in an *expr.Match, an expression that
// google/nftables cannot decode: nothing here evaluates it or takes the
// rule for the agent's.
const UnknownPrefix = "unknown expression "

// xtText writes an xtables match or target as iptables would.
func xtText(name string, info xt.InfoAny, target bool) string {
	if target {
		switch name {
		case "MASQUERADE":
			s := "-j MASQUERADE"
			if r, ok := info.(*xt.NatRange); ok && r.Flags&uint(xt.NatRangeProtoRandomFully) != 0 {
				s += " --random-fully"
			}
			return s
		}
		return "-j " + name
	}
	switch i := info.(type) {
	case *xt.Comment:
		return fmt.Sprintf("-m comment --comment %q", string(*i))
	case *xt.AddrTypeV1:
		var w []string
		if i.Source != 0 {
			if i.Flags&0x1 != 0 {
				w = append(w, "!")
			}
			w = append(w, "--src-type", addrTypes(i.Source))
		}
		if i.Dest != 0 {
			if i.Flags&0x2 != 0 {
				w = append(w, "!")
			}
			w = append(w, "--dst-type", addrTypes(i.Dest))
		}
		return "-m addrtype " + strings.Join(w, " ")
	}
	return "-m " + name
}

func addrTypes(t uint16) string {
	names := []string{"UNSPEC", "UNICAST", "LOCAL", "BROADCAST", "ANYCAST", "MULTICAST", "BLACKHOLE",
		"UNREACHABLE", "PROHIBIT", "THROW", "NAT", "XRESOLVE"}
	var w []string
	for i, n := range names {
		if t&(1<<i) != 0 {
			w = append(w, n)
		}
	}
	return strings.Join(w, ",")
}

package nft

import (
	"bytes"
	"encoding/binary"
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
			// Its ports and flags, as iptables-nft encodes them (IPv4: the
			// multi-range compat struct; IPv6: struct nf_nat_range, which
			// google/nftables leaves undecoded).
			var flags uint
			var lo, hi uint16
			switch r := info.(type) {
			case *xt.NatRange:
				flags, lo, hi = r.Flags, r.MinPort, r.MaxPort
			case *xt.NatIPv4MultiRangeCompat:
				if len(*r) == 1 {
					flags, lo, hi = (*r)[0].Flags, (*r)[0].MinPort, (*r)[0].MaxPort
				}
			case *xt.Unknown:
				if b := []byte(*r); len(b) == 40 {
					flags, lo, hi = uint(binary.NativeEndian.Uint32(b[:4])), binary.BigEndian.Uint16(b[36:38]), binary.BigEndian.Uint16(b[38:40])
				}
			}
			s := "-j MASQUERADE"
			if flags&uint(xt.NatRangeProtoSpecified) != 0 {
				s += fmt.Sprintf(" --to-ports %d-%d", lo, hi)
			}
			if flags&uint(xt.NatRangeProtoRandomFully) != 0 {
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

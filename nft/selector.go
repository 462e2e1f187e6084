package nft

import (
	"net/netip"
	"strconv"
	"strings"

	"github.com/google/nftables/expr"
)

// Packet is what the evaluator knows of a new connection's first packet
// at nat postrouting: its source and destination (of one family; an
// invalid Src is unknown) and the interface it leaves through ("":
// unknown). A rule that reads what is unknown matches "unknown".
//
// The conntrack cleanup judges a flow by its original source and its
// destination after DNAT; the entry does not keep the interface, which the
// daemon's adapter adds from the node's route when a table decides on it.
type Packet struct {
	Src, Dst netip.Addr
	OutIf    string
}

func (p Packet) unmapped() Packet {
	p.Src, p.Dst = p.Src.Unmap(), p.Dst.Unmap()
	return p
}

// Selector is what a rule looks up in one of the agent's sets: a field of
// the packet, one entry of selectors.
type Selector uint8

const (
	SelDaddr Selector = iota + 1 // ip/ip6 daddr: the destination
	SelSaddr                     // ip/ip6 saddr: the source
	SelOif                       // oifname: the interface the packet leaves through
)

// SetKey is the key type of a set, as nft names it.
type SetKey uint8

const (
	KeyIPv4   SetKey = iota + 1 // ipv4_addr
	KeyIPv6                     // ipv6_addr
	KeyIfname                   // ifname
)

func (k SetKey) String() string {
	switch k {
	case KeyIPv4:
		return "ipv4_addr"
	case KeyIPv6:
		return "ipv6_addr"
	case KeyIfname:
		return "ifname"
	}
	return "unknown"
}

// Family is the address family of a set's keys; 0 for a key that is not
// an address.
func (k SetKey) Family() Family {
	switch k {
	case KeyIPv4:
		return 4
	case KeyIPv6:
		return 6
	}
	return 0
}

// addrKey is the key type of a family's addresses.
func addrKey(f Family) SetKey {
	if f == 6 {
		return KeyIPv6
	}
	return KeyIPv4
}

// selector is one row of selectors: what it matches, its sets' key type,
// how a rule loads it (encoded from here, decoded against it, rendered
// with its name), and what the evaluator reads from a packet for it. A new
// selector is a row here, its decision row (build.go) and its config key.
type selector struct {
	what string // what it matches, for messages
	// A payload selector loads a field of the network header: of IPv4
	// and of IPv6 (addrFields); a meta selector loads meta key meta.
	addr [2]addrField
	meta expr.MetaKey
	// value is what the packet holds for it, as the kernel loads it
	// into a register; nil: unknown.
	value func(Packet) []byte
	// text is what the packet holds for it, for explain.
	text func(Packet) string
}

var selectors = [...]selector{
	SelDaddr: {what: "destination", addr: [2]addrField{addrFields[1], addrFields[3]},
		value: func(p Packet) []byte { return addrBytes(p.Dst) }, text: func(p Packet) string { return p.Dst.String() }},
	SelSaddr: {what: "source", addr: [2]addrField{addrFields[0], addrFields[2]},
		value: func(p Packet) []byte {
			if !p.Src.IsValid() || p.Src.Is4() != p.Dst.Is4() {
				return nil
			}
			return addrBytes(p.Src)
		}, text: func(p Packet) string { return p.Src.String() }},
	SelOif: {what: "out interface", meta: expr.MetaKeyOIFNAME,
		value: func(p Packet) []byte {
			if p.OutIf == "" || len(p.OutIf) >= ifNameSize {
				return nil
			}
			b := make([]byte, ifNameSize) // the kernel's IFNAMSIZ, zero-padded
			copy(b, p.OutIf)
			return b
		}, text: func(p Packet) string { return p.OutIf }},
}

// ifNameSize is IFNAMSIZ: an interface name with its terminating zero.
const ifNameSize = 16

// IfnamePrefix is an interface name as an ifname interval set holds it,
// as nft 1.0.6 encodes `oifname { "eth0", "eth*" }`: the name's IFNAMSIZ
// bytes, zero-padded, as a 128-bit value (the shape of an IPv6 address,
// so that the set model, the plan, the batch and the read-back treat it as
// any range): a whole name is one value (a /128), a name with nft's
// trailing "*" the values that start with its bytes (a prefix of 8 bits
// a byte), from the bytes zero-padded to the bytes with the last one
// incremented. ok is false for a name that does not fit.
func IfnamePrefix(name string) (p netip.Prefix, ok bool) {
	base, wild := strings.CutSuffix(name, "*")
	if len(base) >= ifNameSize || (!wild && base == "") {
		return netip.Prefix{}, false
	}
	var b [ifNameSize]byte
	copy(b[:], base)
	bits := 128
	if wild {
		bits = 8 * len(base)
	}
	return netip.PrefixFrom(netip.AddrFrom16(b), bits), true
}

// ifnameString writes an element of an ifname set as nft does ("eth0",
// "eth*"), from its range.
func ifnameString(r Range) string {
	p, ok := r.Prefix()
	if !ok || p.Bits()%8 != 0 {
		return r.String() // not a name nft writes: the bytes
	}
	b := r.From().As16()
	if p.Bits() == 128 {
		return strconv.Quote(strings.TrimRight(string(b[:]), "\x00"))
	}
	return strconv.Quote(string(b[:p.Bits()/8]) + "*")
}

// elementString writes an element of a set of key k as nft does.
func elementString(k SetKey, r Range) string {
	if k == KeyIfname {
		return ifnameString(r)
	}
	return rangeString(r)
}

func addrBytes(a netip.Addr) []byte {
	if !a.IsValid() {
		return nil
	}
	return a.AsSlice()
}

func (s Selector) row() *selector {
	if int(s) < len(selectors) && s != 0 {
		return &selectors[s]
	}
	return nil
}

// isAddr says whether the selector loads an address (its sets are of one
// family, and its rules imply the family).
func (s Selector) isAddr() bool { r := s.row(); return r != nil && r.meta == 0 }

// field is the selector's address field in family f's header.
func (s Selector) field(f Family) addrField {
	if f == 6 {
		return s.row().addr[1]
	}
	return s.row().addr[0]
}

// Key is the key type of the selector's sets of family f.
func (s Selector) Key(f Family) SetKey {
	if s.isAddr() {
		return addrKey(f)
	}
	return KeyIfname
}

// load is the expression that loads the selector of a family's packet
// into register 1, as the agent's rules do.
func (s Selector) load(f Family) expr.Any {
	if s.isAddr() {
		a := s.field(f)
		return &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: a.offset, Len: a.len}
	}
	return &expr.Meta{Key: s.row().meta, Register: 1}
}

// loadedBy returns the selector whose load (in a rule of family f) e is
// exactly, or 0.
func loadedBy(e expr.Any, f Family) Selector {
	for s := Selector(1); int(s) < len(selectors); s++ {
		switch e := e.(type) {
		case *expr.Payload:
			if s.isAddr() && f != 0 && *e == *s.load(f).(*expr.Payload) {
				return s
			}
		case *expr.Meta:
			if !s.isAddr() && *e == *s.load(f).(*expr.Meta) {
				return s
			}
		}
	}
	return 0
}

// name is how nft writes the selector in a rule of family f.
func (s Selector) name(f Family) string {
	if s.row() == nil {
		return ""
	}
	if s.isAddr() {
		return s.field(f).name
	}
	return metaName(s.row().meta) // nft writes oifname unqualified
}

// Daddr loads the destination address of a family's network header into
// register 1, as the agent's rules (and the kernel probe's) do.
func Daddr(f Family) expr.Payload { return *SelDaddr.load(f).(*expr.Payload) }

// payloadSelector returns the selector whose field (in a packet of
// family f) a network-header load of Len bytes at Offset reads, whole or
// in part (iptables-nft loads only the bytes a prefix covers), and the
// offset of the load in the field; 0 when it reads no selector's field.
func payloadSelector(f Family, e *expr.Payload) (sel Selector, off int) {
	if e.OperationType != expr.PayloadLoad || e.Base != expr.PayloadBaseNetworkHeader {
		return 0, 0
	}
	for s := Selector(1); int(s) < len(selectors); s++ {
		if !s.isAddr() {
			continue
		}
		a := s.field(f)
		if off := int(e.Offset) - int(a.offset); off >= 0 && off+int(e.Len) <= int(a.len) {
			return s, off
		}
	}
	return 0, 0
}

// metaSelector returns the selector a meta load of key k reads, or 0.
func metaSelector(k expr.MetaKey) Selector {
	for s := Selector(1); int(s) < len(selectors); s++ {
		if !s.isAddr() && selectors[s].meta == k {
			return s
		}
	}
	return 0
}

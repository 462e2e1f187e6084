package nft

import (
	"bytes"
	"encoding/binary"
	"net/netip"

	"go4.org/netipx"
)

// Range is a set element: the addresses From() to To(). It holds bytes,
// not two netip.Addr as netipx.IPRange does: a netip.Addr holds a
// pointer, and a table of 100,000 elements, kept and rebuilt at every
// change, was 200,000 pointers for each cycle of the garbage collector to
// follow, and a write barrier on every copy. Zones are not kept (no
// element has one).
type Range struct {
	from, to [16]byte // As16 of each
	ff, tf   uint8    // the family of each: 4, 6, or 0 for the zero Addr
}

// RangeFrom is netipx.IPRangeFrom: valid when from and to are of one
// family and from is not after to.
func RangeFrom(from, to netip.Addr) Range {
	return Range{from: from.As16(), to: to.As16(), ff: family(from), tf: family(to)}
}

// RangeOfPrefix is netipx.RangeOfPrefix.
func RangeOfPrefix(p netip.Prefix) Range { return rangeOf(netipx.RangeOfPrefix(p)) }

// range4 is the IPv4 range from-to, as integers.
func range4(from, to uint32) Range {
	r := Range{ff: 4, tf: 4}
	r.from[10], r.from[11], r.to[10], r.to[11] = 0xff, 0xff, 0xff, 0xff
	r.from[12], r.from[13], r.from[14], r.from[15] = byte(from>>24), byte(from>>16), byte(from>>8), byte(from)
	r.to[12], r.to[13], r.to[14], r.to[15] = byte(to>>24), byte(to>>16), byte(to>>8), byte(to)
	return r
}

func rangeOf(r netipx.IPRange) Range { return RangeFrom(r.From(), r.To()) }

func family(a netip.Addr) uint8 {
	switch {
	case a.Is4():
		return 4
	case a.Is6():
		return 6
	}
	return 0
}

func addrOf(b [16]byte, f uint8) netip.Addr {
	switch f {
	case 4:
		return netip.AddrFrom4([4]byte(b[12:]))
	case 6:
		return netip.AddrFrom16(b)
	}
	return netip.Addr{}
}

func (r Range) From() netip.Addr { return addrOf(r.from, r.ff) }
func (r Range) To() netip.Addr   { return addrOf(r.to, r.tf) }

// IPRange is r as netipx has it.
func (r Range) IPRange() netipx.IPRange { return netipx.IPRangeFrom(r.From(), r.To()) }

func (r Range) IsValid() bool                { return r.IPRange().IsValid() }
func (r Range) Contains(a netip.Addr) bool   { return r.IPRange().Contains(a) }
func (r Range) Prefix() (netip.Prefix, bool) { return r.IPRange().Prefix() }
func (r Range) Prefixes() []netip.Prefix     { return r.IPRange().Prefixes() }
func (r Range) String() string               { return r.IPRange().String() }
func (r Range) Overlaps(o Range) bool        { return r.IPRange().Overlaps(o.IPRange()) }
func (r Range) MarshalText() ([]byte, error) { return r.IPRange().MarshalText() }

func (r *Range) UnmarshalText(text []byte) error {
	var x netipx.IPRange
	if err := x.UnmarshalText(text); err != nil {
		return err
	}
	*r = rangeOf(x)
	return nil
}

// compareRange orders ranges as netip.Addr.Compare orders their first
// addresses (the family first, IPv4 before IPv6), then their last ones.
func compareRange(a, b Range) int {
	if c := compareAddr(a.from, a.ff, b.from, b.ff); c != 0 {
		return c
	}
	return compareAddr(a.to, a.tf, b.to, b.tf)
}

func compareAddr(a [16]byte, af uint8, b [16]byte, bf uint8) int {
	switch {
	case af < bf:
		return -1
	case af > bf:
		return 1
	}
	return bytes.Compare(a[:], b[:])
}

// before reports whether next starts right after r ends (r.To().Next() ==
// next.From()), in integers: HasAdjacent asks it of every pair of a set
// of 100,000 at each change.
func (r Range) before(next Range) bool {
	if r.tf == 0 {
		return false
	}
	hi, lo := binary.BigEndian.Uint64(r.to[:8]), binary.BigEndian.Uint64(r.to[8:])
	if (r.tf == 4 && uint32(lo) == 0xffffffff) || (hi == ^uint64(0) && lo == ^uint64(0)) {
		return next.ff == 0 // the top address's Next is the zero Addr
	}
	if r.tf != next.ff {
		return false
	}
	lo++
	if lo == 0 {
		hi++
	}
	return hi == binary.BigEndian.Uint64(next.from[:8]) && lo == binary.BigEndian.Uint64(next.from[8:])
}

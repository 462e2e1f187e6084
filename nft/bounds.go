package nft

import (
	"math/bits"
	"net/netip"

	"github.com/google/nftables/expr"
)

// DaddrBounds returns the destination addresses of family fam at which
// what a rule's matches say can change: the first address of each prefix
// or range its expressions compare the destination with, and the address
// after its last. Between two consecutive bounds, MatchExprs gives one
// answer for every address, so evaluating the first address of each
// interval decides the whole interval (original.Compare). ok is false
// when the rule compares the destination in a way that has no such finite
// bounds (a mask that is not a prefix, a load from the middle of the
// address); the comparison is then not exact.
func DaddrBounds(exprs []expr.Any, fam Family) (out []netip.Addr, ok bool) {
	field := SelDaddr.field(fam)
	size := 4
	if fam == 6 {
		size = 16
	}
	type loaded struct {
		len  int    // the address's first len bytes
		mask []byte // nil: none
	}
	regs := map[uint32]loaded{}
	ok = true
	pad := func(b []byte, fill byte) netip.Addr {
		a := make([]byte, size)
		copy(a, b)
		for i := len(b); i < size; i++ {
			a[i] = fill
		}
		x, _ := netip.AddrFromSlice(a)
		return x
	}
	add := func(r Range) {
		out = append(out, r.From())
		if n := r.To().Next(); n.IsValid() {
			out = append(out, n)
		}
	}
	for _, e := range exprs {
		switch e := e.(type) {
		case *expr.Payload:
			delete(regs, e.DestRegister)
			if e.OperationType != expr.PayloadLoad || e.Base != expr.PayloadBaseNetworkHeader {
				continue
			}
			off := int(e.Offset) - int(field.offset)
			if off+int(e.Len) <= 0 || off >= size {
				continue // not the destination address
			}
			if off != 0 {
				ok = false
				continue
			}
			regs[e.DestRegister] = loaded{len: int(e.Len)}
		case *expr.Bitwise:
			l, found := regs[e.SourceRegister]
			delete(regs, e.DestRegister)
			if !found {
				continue
			}
			for _, x := range e.Xor {
				if x != 0 {
					ok = false
				}
			}
			l.mask = e.Mask
			regs[e.DestRegister] = l
		case *expr.Cmp:
			l, found := regs[e.Register]
			if !found || len(e.Data) != l.len {
				continue
			}
			n := l.len * 8
			if l.mask != nil {
				n = prefixLen(l.mask)
				if n < 0 {
					// Not a prefix (iptables -d A/255.0.255.0): the
					// prefixes it matches, when they are few.
					ps, few := maskPrefixes(e.Data, l.mask, size)
					for _, p := range ps {
						add(RangeOfPrefix(p))
					}
					ok = ok && few
					continue
				}
			}
			add(RangeOfPrefix(netip.PrefixFrom(pad(e.Data, 0), n).Masked()))
		case *expr.Range:
			l, found := regs[e.Register]
			if !found || l.mask != nil || len(e.FromData) != l.len || len(e.ToData) != l.len {
				continue
			}
			add(RangeFrom(pad(e.FromData, 0), pad(e.ToData, 0xff)))
		case *expr.Meta:
			delete(regs, e.Register)
		case *expr.Immediate:
			delete(regs, e.Register)
		case *expr.Fib:
			delete(regs, e.Register)
		default:
			if d, isLoad := destRegister(e); isLoad {
				delete(regs, d)
			}
		}
	}
	return out, ok
}

// MaxMaskPieces bounds the prefixes a mask that is not a prefix is
// split into (2^12): beyond, its bounds are not listed (not exact).
const MaxMaskPieces = 1 << 12

// maskPrefixes are the prefixes of addresses (size bytes) whose first
// len(mask) bytes, masked, equal data's: one per value of the mask's
// zero bits before its last one bit, each as long as that bit's place.
// few is false (and none returned) when there are more than MaxMaskPieces.
func maskPrefixes(data, mask []byte, size int) (out []netip.Prefix, few bool) {
	if len(mask) != len(data) || len(mask) > size {
		return nil, false
	}
	last := -1 // the place of the last one bit
	var free []int
	for i := range len(mask) * 8 {
		if mask[i/8]&(0x80>>(i%8)) != 0 {
			last = i
		}
	}
	for i := range last {
		if mask[i/8]&(0x80>>(i%8)) == 0 {
			free = append(free, i)
		}
	}
	if len(free) > bits.Len(MaxMaskPieces)-1 {
		return nil, false
	}
	for v := range 1 << len(free) {
		a := make([]byte, size)
		for i := range mask {
			a[i] = data[i] & mask[i]
		}
		for j, i := range free {
			if v&(1<<(len(free)-1-j)) != 0 {
				a[i/8] |= 0x80 >> (i % 8)
			}
		}
		x, _ := netip.AddrFromSlice(a)
		out = append(out, netip.PrefixFrom(x, last+1))
	}
	return out, true
}

// prefixLen is the length of a contiguous prefix mask, or -1.
func prefixLen(mask []byte) int {
	n, done := 0, false
	for _, b := range mask {
		ones := bits.LeadingZeros8(^b)
		if done && b != 0 || ones < 8 && b<<ones != 0 {
			return -1
		}
		n += ones
		done = done || ones < 8
	}
	return n
}

// SetBounds returns the bounds (as DaddrBounds) of the elements of the
// table's sets of family fam, adjacent elements of a set taken as one:
// between two of them, a set lookup gives one answer. The agent's own
// rules compare the destination only through them.
func (t Table) SetBounds(fam Family) []netip.Addr {
	var out []netip.Addr
	for _, s := range t.Sets {
		if s.Key.Family() != fam {
			continue
		}
		for _, r := range s.Merged() {
			out = append(out, r.From())
			if n := r.To().Next(); n.IsValid() {
				out = append(out, n)
			}
		}
	}
	return out
}

// Merged is the set's elements with adjacent ones joined: what a lookup
// matches, whichever element matches it.
func (s Set) Merged() []Range {
	var out []Range
	for _, r := range s.Elements {
		if n := len(out); n > 0 && out[n-1].before(r) {
			out[n-1] = RangeFrom(out[n-1].From(), r.To())
			continue
		}
		out = append(out, r)
	}
	return out
}

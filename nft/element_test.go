package nft

import (
	"math/rand/v2"
	"net/netip"
	"testing"

	"go4.org/netipx"
)

// TestRangeAsIPRange: Range gives back the addresses it was made of, and
// orders, compares and prints as netipx.IPRange does, for both families,
// IPv4-mapped IPv6, the zero Addr, and ranges that are not valid.
func TestRangeAsIPRange(t *testing.T) {
	r := rand.New(rand.NewPCG(34, 2026))
	addr := func() netip.Addr {
		switch r.IntN(5) {
		case 0:
			return netip.Addr{}
		case 1:
			var b [16]byte
			b[10], b[11], b[15] = 0xff, 0xff, byte(r.IntN(3))
			return netip.AddrFrom16(b) // ::ffff:0.0.0.x, an IPv6 address
		case 2:
			var b [16]byte
			for i := range b {
				b[i] = byte(r.IntN(3))
			}
			return netip.AddrFrom16(b)
		}
		return netip.AddrFrom4([4]byte{byte(r.IntN(3)), 0, byte(r.IntN(2)), byte(r.IntN(3))})
	}
	var rs []netipx.IPRange
	for _, s := range []string{"0.0.0.0-255.255.255.255", "255.255.255.255-255.255.255.255", "10.0.0.0-10.0.0.255", "10.0.1.0-10.0.1.7",
		"::-ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "::1-::ffff:ffff:ffff:ffff", "0:0:0:1::-0:0:0:1::1", "::ffff:10.0.0.0-::ffff:10.0.0.255", "::ffff:10.0.1.0-::ffff:10.0.1.1"} {
		rs = append(rs, netipx.MustParseIPRange(s))
	}
	for range 300 {
		rs = append(rs, netipx.IPRangeFrom(addr(), addr()))
	}
	for _, a := range rs {
		x := RangeFrom(a.From(), a.To())
		if x.From() != a.From() || x.To() != a.To() || x.IPRange() != a || x.IsValid() != a.IsValid() || x.String() != a.String() {
			t.Fatalf("%v: Range gives %v-%v, valid %v, %q", a, x.From(), x.To(), x.IsValid(), x.String())
		}
		for _, b := range rs {
			y := RangeFrom(b.From(), b.To())
			want := a.From().Compare(b.From())
			if want == 0 {
				want = a.To().Compare(b.To())
			}
			if got := compareRange(x, y); got != want || (x == y) != (a == b) {
				t.Fatalf("%v and %v: compareRange %d, want %d; equal %v, want %v", a, b, got, want, x == y, a == b)
			}
			if got, want := x.before(y), a.To().Next() == b.From(); got != want {
				t.Fatalf("%v before %v: %v, want %v", a, b, got, want)
			}
		}
	}
	for _, p := range []string{"0.0.0.0/0", "10.0.0.0/8", "192.0.2.7/32", "::/0", "2001:db8::/32", "::ffff:10.0.0.0/104"} {
		p := netip.MustParsePrefix(p)
		if got, want := RangeOfPrefix(p).IPRange(), netipx.RangeOfPrefix(p); got != want {
			t.Errorf("RangeOfPrefix(%v) = %v, want %v", p, got, want)
		}
	}
	for range 1000 {
		from, to := r.Uint32(), r.Uint32()
		a := netipx.IPRangeFrom(netip.AddrFrom4([4]byte{byte(from >> 24), byte(from >> 16), byte(from >> 8), byte(from)}),
			netip.AddrFrom4([4]byte{byte(to >> 24), byte(to >> 16), byte(to >> 8), byte(to)}))
		if got := range4(from, to); got != RangeFrom(a.From(), a.To()) {
			t.Fatalf("range4(%#x, %#x) = %v, want %v", from, to, got, a)
		}
	}
}

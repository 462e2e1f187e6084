package nft

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/google/nftables/expr"
)

// The bounds of the destination matches iptables-nft writes: a prefix as
// a load of the bytes it covers, with a mask for the rest; a range; and
// what has no finite bounds.
func TestDaddrBounds(t *testing.T) {
	load := func(fam Family, n uint32) *expr.Payload { d := Daddr(fam); d.Len = n; return &d }
	// 172.x.0.0/16 for every x whose low 4 bits are 1: 16 prefixes.
	var maskWant []string
	for x := 1; x < 256; x += 16 {
		maskWant = append(maskWant, netip.AddrFrom4([4]byte{172, byte(x), 0, 0}).String(), netip.AddrFrom4([4]byte{172, byte(x + 1), 0, 0}).String())
	}
	for _, tc := range []struct {
		name  string
		fam   Family
		exprs []expr.Any
		want  []string
		ok    bool
	}{
		{"/8", 4, []expr.Any{load(4, 1), &expr.Cmp{Register: 1, Data: []byte{10}}}, []string{"10.0.0.0", "11.0.0.0"}, true},
		{"/12", 4, []expr.Any{load(4, 2), &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 2, Mask: []byte{255, 240}, Xor: []byte{0, 0}},
			&expr.Cmp{Register: 1, Data: []byte{172, 16}}}, []string{"172.16.0.0", "172.32.0.0"}, true},
		{"/32 at the top", 4, []expr.Any{load(4, 4), &expr.Cmp{Register: 1, Op: expr.CmpOpNeq, Data: []byte{255, 255, 255, 255}}}, []string{"255.255.255.255"}, true},
		{"/33 v6", 6, []expr.Any{load(6, 5), &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 5, Mask: []byte{255, 255, 255, 255, 128}, Xor: make([]byte, 5)},
			&expr.Cmp{Register: 1, Data: []byte{0x20, 0x01, 0x0d, 0xb8, 0}}}, []string{"2001:db8::", "2001:db8:8000::"}, true},
		{"range", 4, []expr.Any{load(4, 4), &expr.Range{Register: 1, Op: expr.CmpOpEq, FromData: []byte{192, 0, 2, 10}, ToData: []byte{192, 0, 2, 20}}},
			[]string{"192.0.2.10", "192.0.2.21"}, true},
		{"the source", 4, []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4}, &expr.Cmp{Register: 1, Data: []byte{10, 0, 0, 1}}}, nil, true},
		{"a mask that is no prefix", 4, []expr.Any{load(4, 2), &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 2, Mask: []byte{255, 15}, Xor: []byte{0, 0}},
			&expr.Cmp{Register: 1, Data: []byte{172, 1}}}, maskWant, true},
		{"a mask that is no prefix, too many pieces", 4, []expr.Any{load(4, 4), &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: []byte{255, 0, 0, 255}, Xor: make([]byte, 4)},
			&expr.Cmp{Register: 1, Data: []byte{172, 0, 0, 1}}}, nil, false},
		{"a load from the middle", 4, []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 17, Len: 1}, &expr.Cmp{Register: 1, Data: []byte{1}}}, nil, false},
	} {
		got, ok := DaddrBounds(tc.exprs, tc.fam)
		var s []string
		for _, a := range got {
			s = append(s, a.String())
		}
		if !slices.Equal(s, tc.want) || ok != tc.ok {
			t.Errorf("%s: %v %v, want %v %v", tc.name, s, ok, tc.want, tc.ok)
		}
	}
	tbl := Table{Sets: []Set{{Key: KeyIPv4, Elements: rangesOf([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")})}, {Key: KeyIPv6}}}
	if b := tbl.SetBounds(4); len(b) != 2 || b[1] != netip.MustParseAddr("11.0.0.0") {
		t.Errorf("SetBounds %v", b)
	}
	for m, want := range map[string]int{"\xff\xf0": 12, "\xff\xff": 16, "\x00\x00": 0, "\xff\x0f": -1, "\xf0\xff": -1, "\x80": 1} {
		if got := prefixLen([]byte(m)); got != want {
			t.Errorf("prefixLen(%x) = %d, want %d", m, got, want)
		}
	}
}

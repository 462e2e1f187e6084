package nft

import (
	"testing"

	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
)

// The original's MASQUERADE is described with its --to-ports and
// --random-fully as iptables-nft encodes them (IPv4: the multi-range
// compat struct; IPv6: nf_nat_range, which google/nftables leaves
// undecoded): the text is what tells one rewrite from another.
func TestDescribeMasquerade(t *testing.T) {
	v6 := make(xt.Unknown, 40)
	v6[0] = 18 // NF_NAT_RANGE_PROTO_SPECIFIED | NF_NAT_RANGE_PROTO_RANDOM_FULLY (native endian: little here)
	v6[36], v6[37], v6[38], v6[39] = 4, 0, 117, 47
	for _, tc := range []struct {
		info xt.InfoAny
		want string
	}{
		{&xt.NatIPv4MultiRangeCompat{{Flags: 18, MinPort: 1024, MaxPort: 29999}}, "-j MASQUERADE --to-ports 1024-29999 --random-fully"},
		{&xt.NatIPv4MultiRangeCompat{{Flags: 0}}, "-j MASQUERADE"},
		{&v6, "-j MASQUERADE --to-ports 1024-29999 --random-fully"},
	} {
		if got := DescribeExprs([]expr.Any{&expr.Target{Name: "MASQUERADE", Info: tc.info}}); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.info, got, tc.want)
		}
	}
}

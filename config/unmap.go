package config

import "net/netip"

// UnmapPrefix returns an IPv4-mapped IPv6 prefix (::ffff:10.0.0.0/104) as
// the IPv4 prefix it stands for (10.0.0.0/8), which is what the kernel
// matches: an IPv4 packet's address is never seen in IPv6 form. Any other
// prefix is returned as it is; mapped says which it was.
func UnmapPrefix(p netip.Prefix) (q netip.Prefix, mapped bool) {
	if p.Addr().Is4In6() && p.Bits() >= ipv4MappedBits {
		return netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-ipv4MappedBits), true
	}
	return p, false
}

package config

import "net/netip"

// The link-local ranges that masqLinkLocal and masqLinkLocalIPv6 are
// about: not masqueraded unless those keys say so, as in the original.
var (
	LinkLocalIPv4 = netip.MustParsePrefix("169.254.0.0/16")
	LinkLocalIPv6 = netip.MustParsePrefix("fe80::/10") // RFC 4291
)

package main

import (
	"net/netip"

	"github.com/vishvananda/netlink"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// routeOutIf is the interface the node's routing table sends traffic from
// src to dst through, as the kernel routes a pod's forwarded packet (ip
// route get DST from SRC iif DEV, DEV being the route back to src); when
// that cannot be asked (src unknown or the node's own), the route to dst;
// "" when there is none. egressInterfaces decides on it, and neither
// explain nor a conntrack entry knows it otherwise.
func routeOutIf(src, dst netip.Addr) string {
	if src.IsValid() {
		if back, err := netlink.RouteGet(src.AsSlice()); err == nil && len(back) > 0 && back[0].LinkIndex > 0 {
			rs, err := netlink.RouteGetWithOptions(dst.AsSlice(), &netlink.RouteGetOptions{SrcAddr: src.AsSlice(), IifIndex: back[0].LinkIndex})
			if err == nil && len(rs) > 0 && rs[0].LinkIndex > 0 {
				return linkName(rs[0].LinkIndex)
			}
		}
	}
	rs, err := netlink.RouteGet(dst.AsSlice())
	if err != nil || len(rs) == 0 || rs[0].LinkIndex <= 0 {
		return ""
	}
	return linkName(rs[0].LinkIndex)
}

func linkName(index int) string {
	l, err := netlink.LinkByIndex(index)
	if err != nil {
		return ""
	}
	return l.Attrs().Name
}

// matchesOutIf reports whether a table's rules decide on the out interface
// (egressInterfaces), so that a route is worth asking for.
func matchesOutIf(t nft.Table) bool {
	for _, c := range t.Chains {
		for _, r := range c.Rules {
			if r.Selector == nft.SelOif {
				return true
			}
		}
	}
	return false
}

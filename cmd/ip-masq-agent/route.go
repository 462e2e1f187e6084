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
func routeOutIf(src, dst netip.Addr) string { return newRouter().outIf(src, dst) }

// router asks routes and remembers, for one cleanup, each source's
// interface and each link's name (many flows share them).
type router struct {
	back  map[netip.Addr]int // the link of the route back to a source; 0: none
	names map[int]string
}

func newRouter() *router { return &router{back: map[netip.Addr]int{}, names: map[int]string{}} }

func (r *router) outIf(src, dst netip.Addr) string {
	if src.IsValid() {
		iif, ok := r.back[src]
		if !ok {
			if rs, err := netlink.RouteGet(src.AsSlice()); err == nil && len(rs) > 0 {
				iif = rs[0].LinkIndex
			}
			r.back[src] = iif
		}
		if iif > 0 {
			rs, err := netlink.RouteGetWithOptions(dst.AsSlice(), &netlink.RouteGetOptions{SrcAddr: src.AsSlice(), IifIndex: iif})
			if err == nil && len(rs) > 0 && rs[0].LinkIndex > 0 {
				return r.linkName(rs[0].LinkIndex)
			}
		}
	}
	rs, err := netlink.RouteGet(dst.AsSlice())
	if err != nil || len(rs) == 0 || rs[0].LinkIndex <= 0 {
		return ""
	}
	return r.linkName(rs[0].LinkIndex)
}

func (r *router) linkName(index int) string {
	if n, ok := r.names[index]; ok {
		return n
	}
	n := ""
	if l, err := netlink.LinkByIndex(index); err == nil {
		n = l.Attrs().Name
	}
	r.names[index] = n
	return n
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

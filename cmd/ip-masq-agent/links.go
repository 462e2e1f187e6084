package main

import (
	"net"
	"net/netip"
)

// nodeLinks is nft.Options.Links on this node (the daemon's, and the
// tools' in its pod): the names of the interfaces that hold address a, as
// the kernel lists them (RTM_GETADDR, through net.Interfaces).
func nodeLinks(a netip.Addr) []string {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil
	}
	var out []string
	for _, i := range ifs {
		addrs, err := i.Addrs()
		if err != nil {
			continue
		}
		for _, x := range addrs {
			if p, err := netip.ParsePrefix(x.String()); err == nil && p.Addr().Unmap() == a.Unmap() {
				out = append(out, i.Name)
				break
			}
		}
	}
	return out
}

// linkAddrs are the addresses of the interface named link.
func linkAddrs(link string) []netip.Addr {
	i, err := net.InterfaceByName(link)
	if err != nil {
		return nil
	}
	addrs, err := i.Addrs()
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, x := range addrs {
		if p, err := netip.ParsePrefix(x.String()); err == nil {
			out = append(out, p.Addr().Unmap())
		}
	}
	return out
}

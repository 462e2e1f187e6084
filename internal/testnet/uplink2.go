package testnet

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
)

// The second uplink: a second link between node and ext, with its own
// addresses, and routes on the node that send Uplink2Dst4 and Uplink2Dst6
// through it (everything else still leaves through NodeUplinkIf).
const (
	NodeUplink2If = "ens5" // the node's second uplink (node ns): another name family than eth0, for "ens*"
	ExtUplink2If  = "eth1" // ext's end of it (ext ns)
)

var (
	NodeUplink2v4 = netip.MustParseAddr("198.51.100.1")  // what a packet masqueraded through ens5 carries
	NodeUplink2v6 = netip.MustParseAddr("2001:db8:2::1") // the same for IPv6
	Uplink2Dst4   = netip.MustParseAddr("203.0.113.200") // a destination the node routes through ens5
	Uplink2Dst6   = netip.MustParseAddr("2001:db8:cc::10")
)

// AddUplink2 adds the second uplink and its routes, and the destinations
// Uplink2Dst4 and Uplink2Dst6 in ext. The replies of unmasqueraded
// traffic come back through the first uplink (ext routes the pods' ranges
// there), so reverse-path filtering is off in the node and ext namespaces.
func (t *Topology) AddUplink2() error {
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return errors.New("testnet: topology closed")
	}
	node, ext := t.nl[t.NodeNS], t.nl[t.ExtNS]
	la := netlink.NewLinkAttrs()
	la.Name = NodeUplink2If
	if err := node.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: ExtUplink2If, PeerNamespace: netlink.NsFd(t.ns[t.ExtNS])}); err != nil {
		return fmt.Errorf("veth %s/%s: %w", NodeUplink2If, ExtUplink2If, err)
	}
	for _, u := range []struct {
		h    *netlink.Handle
		link string
	}{{node, NodeUplink2If}, {ext, ExtUplink2If}} {
		l, err := u.h.LinkByName(u.link)
		if err != nil {
			return fmt.Errorf("link %s: %w", u.link, err)
		}
		if err := u.h.LinkSetUp(l); err != nil {
			return fmt.Errorf("link %s up: %w", u.link, err)
		}
	}
	for _, a := range []struct {
		h    *netlink.Handle
		link string
		p    string
	}{
		{node, NodeUplink2If, "198.51.100.1/30"},
		{node, NodeUplink2If, "2001:db8:2::1/64"},
		{ext, ExtUplink2If, "198.51.100.2/30"},
		{ext, ExtUplink2If, "2001:db8:2::2/64"},
	} {
		if err := addAddr(a.h, a.link, netip.MustParsePrefix(a.p)); err != nil {
			return err
		}
	}
	l, err := node.LinkByName(NodeUplink2If)
	if err != nil {
		return err
	}
	for _, r := range []struct{ dst, gw string }{{"203.0.113.192/26", "198.51.100.2"}, {"2001:db8:cc::/48", "2001:db8:2::2"}} {
		rt := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: prefixToIPNet(netip.MustParsePrefix(r.dst)),
			Gw: net.IP(netip.MustParseAddr(r.gw).AsSlice())}
		if err := node.RouteAdd(rt); err != nil {
			return fmt.Errorf("route %s via %s: %w", r.dst, r.gw, err)
		}
	}
	for ns, devs := range map[string][]string{t.NodeNS: {NodeUplinkIf, NodeUplink2If}, t.ExtNS: {ExtIf, ExtUplink2If}} {
		if err := InNS(t.ns[ns], func() error {
			for _, dev := range append([]string{"all", "default"}, devs...) {
				if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+dev+"/rp_filter", []byte("0"), 0o644); err != nil {
					return fmt.Errorf("rp_filter of %s in %s: %w", dev, ns, err)
				}
			}
			return nil
		}); err != nil {
			return err
		}
	}
	for _, d := range []netip.Addr{Uplink2Dst4, Uplink2Dst6} {
		if err := t.AddDestination(d); err != nil {
			return err
		}
	}
	return nil
}

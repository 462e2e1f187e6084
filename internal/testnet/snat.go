package testnet

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// AddNodeAddress adds p (such as 192.0.2.10/24 or 2001:db8:1::10/64, in
// the uplink's subnets) to the node's interface link: a second address of
// the node, for snatAddress.
func (t *Topology) AddNodeAddress(link string, p netip.Prefix) error {
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return errors.New("testnet: topology closed")
	}
	return addAddr(t.nl[t.NodeNS], link, p)
}

// SourceSeenAtPod opens a NEW TCP connection from the ext namespace to the
// pod address dst (forwarded by the node out of its pod-side interface)
// and returns the source address the pod's server saw: traffic that only
// passes through the node, towards a pod.
func (t *Topology) SourceSeenAtPod(dst netip.Addr) (netip.Addr, error) {
	if _, err := t.server(t.PodNS); err != nil {
		return netip.Addr{}, err
	}
	return t.seenOver(t.ExtNS, ExtIf, "tcp", netip.Addr{}, dst)
}

// The second link of the node, to a peer network that routes nothing but
// its own prefixes (as an overlay peer or a second NIC's network does):
// node PeerNodeIf 198.51.100.1/24, 2001:db8:2::1/64 -- peer 198.51.100.2/24,
// 2001:db8:2::2/64.
const (
	PeerNodeIf = "eth1" // the node's interface towards the peer (node ns)
	PeerIf     = "eth0" // the peer's (peer ns)
)

var (
	PeerAddr4 = netip.MustParseAddr("198.51.100.2")
	PeerAddr6 = netip.MustParseAddr("2001:db8:2::2")
	PeerNode4 = netip.MustParseAddr("198.51.100.1")
	PeerNode6 = netip.MustParseAddr("2001:db8:2::1")
)

// AddPeer adds a fourth namespace, NAME-peer, linked to the node by a
// second interface (PeerNodeIf), with only the routes of its own
// prefixes: a packet the node sends it from any other source gets no
// answer. Close removes it with the others.
func (t *Topology) AddPeer() (string, error) {
	name := t.Name + "-peer"
	err := onThread(func() error {
		return t.unshareNamed([]nsSpec{{name, [][2]string{{"net/ipv4/ip_forward", "0"}, {"net/ipv6/conf/all/forwarding", "0"}}}})
	})
	if err != nil {
		return "", fmt.Errorf("testnet: peer namespace: %w", err)
	}
	h, err := netlink.NewHandleAt(t.ns[name])
	if err != nil {
		return "", err
	}
	t.nl[name] = h
	la := netlink.NewLinkAttrs()
	la.Name = PeerNodeIf
	if err := t.nl[t.NodeNS].LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: PeerIf, PeerNamespace: netlink.NsFd(t.ns[name])}); err != nil {
		return "", fmt.Errorf("veth %s/%s: %w", PeerNodeIf, PeerIf, err)
	}
	for _, l := range []struct {
		h    *netlink.Handle
		link string
		ps   []string
	}{
		{t.nl[t.NodeNS], PeerNodeIf, []string{"198.51.100.1/24", "2001:db8:2::1/64"}},
		{h, PeerIf, []string{"198.51.100.2/24", "2001:db8:2::2/64"}},
		{h, "lo", nil},
	} {
		link, err := l.h.LinkByName(l.link)
		if err != nil {
			return "", err
		}
		if err := l.h.LinkSetUp(link); err != nil {
			return "", err
		}
		for _, p := range l.ps {
			if err := addAddr(l.h, l.link, netip.MustParsePrefix(p)); err != nil {
				return "", err
			}
		}
	}
	return name, nil
}

// SourceSeenAtPeer is SourceSeen for the peer's address dst (PeerAddr4,
// PeerAddr6): a NEW TCP connection from the pod, through the node's
// second link.
func (t *Topology) SourceSeenAtPeer(peer string, dst netip.Addr) (netip.Addr, error) {
	if _, err := t.server(peer); err != nil {
		return netip.Addr{}, err
	}
	return t.seenOver(t.PodNS, PodIf, "tcp", netip.Addr{}, dst)
}

package testnet

import (
	"errors"
	"net"
	"net/netip"
)

// AddPodAddress adds p (such as 10.244.1.3/24 or fd00:1::3/64, in the
// pod's subnets) to the pod's interface: a second pod source, for
// SourceSeenFrom.
func (t *Topology) AddPodAddress(p netip.Prefix) error {
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return errors.New("testnet: topology closed")
	}
	return addAddr(t.nl[t.PodNS], PodIf, p)
}

// SourceSeenFrom is SourceSeen for a NEW TCP connection from a pod socket
// bound to src (Pod4, Pod6 or an address AddPodAddress added).
func (t *Topology) SourceSeenFrom(src, dst netip.Addr) (netip.Addr, error) {
	if err := t.serve(dst); err != nil {
		return netip.Addr{}, err
	}
	return t.seenOver(t.PodNS, PodIf, "tcp", src, dst)
}

// DialPodUDPFrom is DialPodUDP from a pod socket bound to src.
func (t *Topology) DialPodUDPFrom(src, dst netip.Addr) (*net.UDPConn, error) {
	if err := t.serve(dst); err != nil {
		return nil, err
	}
	c, err := t.dial(t.PodNS, PodIf, "udp", src, dst, ServerPort)
	if err != nil {
		return nil, err
	}
	return c.(*net.UDPConn), nil
}

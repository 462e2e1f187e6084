package testnet

import (
	"net"
	"net/netip"
)

// DialPodUDP opens a connected UDP socket from the pod namespace to
// dst:ServerPort, after starting the server of the namespace that owns dst.
// The server answers each datagram with the source it saw, "ADDRESS
// PORT\n" (ParseSeen parses it). All datagrams of one socket share one
// 5-tuple, so one conntrack entry for as long as they keep it alive: a
// long-lived UDP flow. The caller closes the socket.
func (t *Topology) DialPodUDP(dst netip.Addr) (*net.UDPConn, error) {
	if err := t.serve(dst); err != nil {
		return nil, err
	}
	c, err := t.podDial("udp", dst, ServerPort)
	if err != nil {
		return nil, err
	}
	return c.(*net.UDPConn), nil
}

// ParseSeen parses a server's answer, "ADDRESS PORT\n": the source address
// and port the server saw.
func ParseSeen(s string) (netip.AddrPort, error) { return parseSeen(s) }

// DialPodUDPFromPort is DialPodUDP from the pod socket src (address and
// port): a flow's socket opened again with its 5-tuple.
func (t *Topology) DialPodUDPFromPort(src netip.AddrPort, dst netip.Addr) (*net.UDPConn, error) {
	if err := t.serve(dst); err != nil {
		return nil, err
	}
	var c *net.UDPConn
	err := InNS(t.ns[t.PodNS], func() error {
		var err error
		c, err = net.DialUDP("udp", net.UDPAddrFromAddrPort(src), net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst.Unmap(), ServerPort)))
		return err
	})
	return c, err
}

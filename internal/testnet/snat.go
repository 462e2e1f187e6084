package testnet

import (
	"bufio"
	"errors"
	"fmt"
	"net/netip"
	"time"
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
	c, err := t.dial(t.ExtNS, ExtIf, "tcp", netip.Addr{}, dst, ServerPort)
	if err != nil {
		return netip.Addr{}, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(DialTimeout))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return netip.Addr{}, fmt.Errorf("testnet: reading from %s: %w", dst, err)
	}
	ap, err := parseSeen(line)
	return ap.Addr(), err
}

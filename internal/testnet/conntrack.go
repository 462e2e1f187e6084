package testnet

import (
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// PopulateConntrack flushes the conntrack table and creates n UDP entries from distinct pod
// sources: the stale fraction masqueraded to 203.0.113.x, the others to
// 198.51.100.x (masqueraded) and 10.1.x.x (not), unchanged: the
// benchmark of the conntrack cleanup (conntrack/ and make bench).
func PopulateConntrack(h *netlink.Handle, n int, stale float64) error {
	if err := h.ConntrackTableFlush(netlink.ConntrackTable); err != nil {
		return err
	}
	node := net.IP{192, 0, 2, 1}
	nStale := int(float64(n) * stale)
	for i := range n {
		// Distinct original and reply tuples: the masqueraded ones
		// share the node's address, so (destination, port) varies.
		src := net.IP{10, byte(128 + i>>16), byte(i >> 8), byte(i)}
		sport := uint16(1024 + i%60000)
		d := byte(i / 60000)
		var dst, rdst net.IP
		switch {
		case i < nStale:
			dst, rdst = net.IP{203, 0, 113, d}, node
		case i%2 == 0:
			dst, rdst = net.IP{198, 51, 100, d}, node
		default:
			dst, rdst = net.IP{10, 1, d, 1}, src
		}
		f := &netlink.ConntrackFlow{
			FamilyType: unix.AF_INET,
			Forward:    netlink.IPTuple{Protocol: unix.IPPROTO_UDP, SrcIP: src, DstIP: dst, SrcPort: sport, DstPort: 53},
			Reverse:    netlink.IPTuple{Protocol: unix.IPPROTO_UDP, SrcIP: dst, DstIP: rdst, SrcPort: 53, DstPort: sport},
			TimeOut:    600,
		}
		if err := h.ConntrackCreate(netlink.ConntrackTable, unix.AF_INET, f); err != nil {
			return fmt.Errorf("create entry %d: %w", i, err)
		}
	}
	return nil
}

package conntrack

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Cleanup deletes, in the network namespace ns (0 or -1: the caller's),
// the conntrack entries whose masquerade decision changed from old to new
// and whose NAT state disagrees with new: UDP entries with ModeUDP (and
// the zero Mode), entries of every protocol with ModeAll, nothing with
// ModeNone. Call it after the new rules are applied, so that the next
// packet of a deleted flow meets them.
//
// An entry is left alone when its destination (after DNAT: the reply
// tuple's source) or its original destination is a local address of the
// node (the agent's rule skips `fib daddr type local`), when its original
// source is a local address (node-originated: masquerade changes nothing),
// when new does not handle the destination, when old and new decide the
// same for it, when its NAT state already is new's decision, and when it
// is source-NATed to an address that is not the node's (another table's
// SNAT). Being masqueraded means the reply goes to another address or port
// than the original source.
//
// It dumps each family's table once and deletes the stale entries one
// netlink request each; an entry that is gone by then counts as deleted.
// The error, if any, says what failed; the Result still counts what was
// done (a dump interrupted by concurrent changes is reported as an error
// after the entries it returned are handled).
func Cleanup(ns netns.NsHandle, mode Mode, old, new Decider) (Result, error) {
	start := time.Now()
	var res Result
	if mode == "" {
		mode = DefaultMode
	}
	if _, err := ParseMode(string(mode)); err != nil {
		return res, err
	}
	if mode == ModeNone {
		return res, nil
	}
	if old == nil || new == nil {
		return res, errNilDecider
	}
	if ns == 0 {
		ns = netns.None()
	}
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_NETFILTER, unix.NETLINK_ROUTE)
	if err != nil {
		return res, fmt.Errorf("conntrack: netlink handle: %w", err)
	}
	defer h.Close()
	locals, err := readLocalAddrs(h)
	if err != nil {
		return res, err
	}
	f := &filter{mode: mode, old: newMemo(old), new: newMemo(new), locals: locals}
	var errs []error
	for _, fam := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		n, err := h.ConntrackDeleteFilters(netlink.ConntrackTable, fam, f)
		res.Deleted += int(n)
		if err != nil {
			errs = append(errs, fmt.Errorf("conntrack: IPv%d: %w", map[netlink.InetFamily]int{unix.AF_INET: 4, unix.AF_INET6: 6}[fam], err))
		}
	}
	res.Examined = f.examined
	res.Failed = f.matched - res.Deleted
	res.Duration = time.Since(start)
	return res, errors.Join(errs...)
}

// filter is the CustomConntrackFilter that judges each dumped entry.
type filter struct {
	mode              Mode
	old, new          *memo
	locals            *localAddrs
	examined, matched int
}

func (f *filter) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	f.examined++
	e := entry{
		proto:    flow.Forward.Protocol,
		origSrc:  addr(flow.Forward.SrcIP),
		origDst:  addr(flow.Forward.DstIP),
		replySrc: addr(flow.Reverse.SrcIP),
		replyDst: addr(flow.Reverse.DstIP),
	}
	if judge(e, f.mode, f.old.decide, f.new.decide, f.locals.contains) == deleteStale {
		f.matched++
		return true
	}
	return false
}

func addr(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

// readLocalAddrs reads the routes of type local of the local routing table
// (both families).
func readLocalAddrs(h *netlink.Handle) (*localAddrs, error) {
	routes, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_LOCAL}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("conntrack: local routes: %w", err)
	}
	l := &localAddrs{}
	for _, r := range routes {
		if r.Type != unix.RTN_LOCAL || r.Dst == nil {
			continue
		}
		a, ok := netip.AddrFromSlice(r.Dst.IP)
		if !ok {
			continue
		}
		bits, _ := r.Dst.Mask.Size()
		a = a.Unmap()
		if a.Is4() && bits > 32 {
			bits -= 96
		}
		l.add(netip.PrefixFrom(a, bits))
	}
	return l, nil
}

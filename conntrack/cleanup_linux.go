package conntrack

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// CleanupMarked deletes, in the network namespace ns (0 or -1: the caller's),
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
// SNAT). An entry is source-NATed when its status has IPS_SRC_NAT or its
// reply goes to another address than the original source. Without a mark
// (mark -1), an entry masqueraded to a node address by another
// table (kube-proxy's) for a destination whose decision changed from
// masquerade to not is taken for the agent's and deleted.
//
// It dumps each family's table once over ctnetlink, judging the entries
// as they stream in (only the stale ones are kept), then deletes those in
// batches of netlink requests, each naming the entry by its original
// tuple, zone and conntrack id (an entry replaced meanwhile by a new one
// with the same tuple is not deleted). An entry that is gone by its
// deletion counts as deleted. The error, if any, says what failed; the
// Result still counts what was done (a dump interrupted by concurrent
// changes is reported as an error after the entries it returned are
// handled).
//
// With mark 0-127, the old table's masquerade rules marked the
// connections they masqueraded with that conntrack label bit (-1: they did
// not): an entry the new rules do not masquerade is deleted when it
// carries the mark, and only then; entries masqueraded by another chain
// (kube-proxy's, a CNI's) never carry it.
func CleanupMarked(ns netns.NsHandle, mode Mode, old, new Decider, mark int) (Result, error) {
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
	return run(ns, mark, true, func(e entry, locals *localAddrs) bool {
		return judge(e, mode, old, new, locals.contains, mark) == deleteStale
	})
}

// CleanupReplies deletes, in the network namespace ns, the entries that
// replies made the other way round after CleanupMarked (prev) deleted
// their flow's entry so that it be masqueraded: an entry whose original
// tuple is, byte for byte, the reply tuple of one prev deleted (the
// server's datagram to the pod's address and port, in flight when the
// entry went). The flow's next packets from the pod would match it as
// replies and leave unmasqueraded for as long as the flow goes on; once
// it is deleted, the next one makes an entry that the rules masquerade.
// No flow started from outside can have that tuple while the deleted
// entry existed. Call it a round trip or more after CleanupMarked; again,
// while it finds some, for a flow whose replies keep coming.
func CleanupReplies(ns netns.NsHandle, prev Result) (Result, error) {
	if len(prev.replies) == 0 {
		return Result{}, nil
	}
	res, err := run(ns, -1, false, func(e entry, _ *localAddrs) bool { return prev.replies[replyKey(e.origTuple)] })
	res.replies = prev.replies
	return res, err
}

// CleanupNATedTo deletes, in the network namespace ns, the conntrack
// entries of mode's protocols that are source-NATed to one of the
// addresses to, and carry the label bit mark (any, when mark is -1): after
// a change of snatAddress, the flows NATed to an address they would no
// longer get, so that their next packet meets the new rule. The daemon
// gives the old snat address, or, for a new one, the other addresses of
// the interface that holds it (what masquerade gave before).
func CleanupNATedTo(ns netns.NsHandle, mode Mode, to []netip.Addr, mark int) (Result, error) {
	if mode == "" {
		mode = DefaultMode
	}
	if _, err := ParseMode(string(mode)); err != nil {
		return Result{}, err
	}
	if mode == ModeNone || len(to) == 0 {
		return Result{}, nil
	}
	set := make(map[netip.Addr]bool, len(to))
	for _, a := range to {
		set[a.Unmap()] = true
	}
	return run(ns, mark, false, func(e entry, _ *localAddrs) bool { return judgeNATedTo(e, mode, set, mark) == deleteStale })
}

// run dumps the conntrack table of ns, both families, and deletes the
// entries stale says are. replies: record the reply tuples of the deleted
// entries that were not NATed (CleanupMarked's, for CleanupReplies).
func run(ns netns.NsHandle, mark int, replies bool, stale func(entry, *localAddrs) bool) (Result, error) {
	start := time.Now()
	var res Result
	if mark > 127 {
		return res, fmt.Errorf("conntrack: label bit %d: want 0-127", mark)
	}
	if ns == 0 {
		ns = netns.None()
	}
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return res, fmt.Errorf("conntrack: netlink handle: %w", err)
	}
	locals, err := readLocalAddrs(h)
	h.Close()
	if err != nil {
		return res, err
	}
	s, err := nl.GetNetlinkSocketAt(ns, netns.None(), unix.NETLINK_NETFILTER)
	if err != nil {
		return res, fmt.Errorf("conntrack: netlink socket: %w", err)
	}
	defer s.Close()
	c := &conn{fd: s.GetFd(), buf: make([]byte, 1<<20)}
	if err := c.setup(); err != nil {
		return res, err
	}
	// One dump of both families (AF_UNSPEC): the kernel walks every
	// bucket of its conntrack hash for a dump, entries of this namespace
	// or not (262,144 buckets: about 10 ms), so a dump per family cost
	// that twice at every change.
	var errs []error
	toDelete := map[uint8][][]byte{}
	n, err := c.dump(unix.AF_UNSPEC, func(msg []byte) {
		e, ref, ok := parseEntry(msg)
		if !ok {
			return
		}
		if fam := msg[0]; (fam == unix.AF_INET || fam == unix.AF_INET6) && stale(e, locals) {
			toDelete[fam] = append(toDelete[fam], ref.request())
			// Not NATed, and deleted: to be masqueraded from now on.
			if replies && !e.statusSNAT && e.replyDst == e.origSrc && ref.reply != nil {
				if res.replies == nil {
					res.replies = map[string]bool{}
				}
				res.replies[replyKey(ref.reply)] = true
			}
		}
	})
	res.Examined += n
	if err != nil {
		errs = append(errs, fmt.Errorf("conntrack: dump: %w", err))
	}
	for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
		deleted, failed, err := c.delete(fam, toDelete[fam])
		res.Deleted += deleted
		res.Failed += failed
		if err != nil {
			errs = append(errs, fmt.Errorf("conntrack: delete (IPv%d): %w", famVersion(fam), err))
		}
	}
	res.Duration = time.Since(start)
	return res, errors.Join(errs...)
}

func famVersion(fam uint8) int {
	if fam == unix.AF_INET6 {
		return 6
	}
	return 4
}

const ipsSrcNAT = 1 << 4 // IPS_SRC_NAT

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

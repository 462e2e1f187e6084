// Package conntrack deletes the conntrack entries whose masquerade decision
// a configuration change made wrong.
//
// The agent's rules decide once per connection, on its first packet, and
// conntrack keeps that decision for the connection's life. A UDP flow that
// never pauses (metrics, logs, RTP) keeps its entry, and so its old
// decision, forever. After the new rules are applied, CleanupMarked dumps the
// conntrack table of the node's network namespace over netlink and deletes
// the entries whose NAT state disagrees with the new decision for their
// destination, when that decision changed; the next packet of the flow then
// creates a new entry, which the new rules decide.
package conntrack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Mode says which conntrack entries CleanupMarked may delete: the value of the
// flag --conntrack-cleanup.
type Mode string

const (
	// ModeUDP deletes stale UDP entries only (the default): TCP
	// connections keep their old decision until they end, which is what
	// keeps them working.
	ModeUDP Mode = "udp"
	// ModeAll deletes stale entries of every protocol: established TCP
	// connections to the changed ranges break (their next packet is
	// rewritten differently, or not at all), a hard cut-over.
	ModeAll Mode = "all"
	// ModeNone deletes nothing.
	ModeNone Mode = "none"
	// DefaultMode is the flag's default.
	DefaultMode = ModeUDP
)

// ParseMode parses the value of --conntrack-cleanup: "udp", "all" or
// "none" (case-insensitive, surrounding blanks ignored); "" is the default,
// "udp".
func ParseMode(s string) (Mode, error) {
	switch m := Mode(strings.ToLower(strings.TrimSpace(s))); m {
	case "":
		return DefaultMode, nil
	case ModeUDP, ModeAll, ModeNone:
		return m, nil
	}
	return "", fmt.Errorf("invalid conntrack cleanup mode %q: want udp, all or none", s)
}

// String returns the mode as the flag spells it; the zero Mode is "udp".
func (m Mode) String() string {
	if m == "" {
		return string(DefaultMode)
	}
	return string(m)
}

// Set parses s with ParseMode, so that a *Mode is a flag.Value.
func (m *Mode) Set(s string) error {
	v, err := ParseMode(s)
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// Flow is what the agent's rules saw of a connection: its original
// source and its destination (after DNAT). The interface it left through
// is not known here (an entry does not keep its route): the Decider finds
// it (the daemon's asks the node's route), or a rule that matches on it
// leaves the decision undetermined, and the entry is kept.
type Flow struct{ Src, Dst netip.Addr }

// Decider says what the agent's rules decide for a new connection:
// masquerade or not. handled is false for destinations the agent does not
// handle at all (IPv6 without --enable-ipv6); masquerade is then
// meaningless. nft.Table's Decider remembers its answers (many entries
// share a destination), so a cleanup asks it once per entry.
type Decider func(Flow) (masquerade, handled bool)

// Result is what one CleanupMarked did.
type Result struct {
	Examined int           // entries dumped (of both families)
	Deleted  int           // entries deleted (or gone by the time of their deletion)
	Failed   int           // entries whose deletion failed
	Duration time.Duration // dump, decisions and deletions
	// replies: the reply tuples of the entries deleted so that their flow
	// be masqueraded (not NATed before): a reply in flight when its entry
	// went makes a new entry the other way round, which the flow's next
	// packets then match as replies, never masqueraded (CleanupReplies).
	replies map[string]bool
}

// Replies is the number of deleted entries whose reply could re-create
// them the other way round (see CleanupReplies).
func (r Result) Replies() int { return len(r.replies) }

func (r Result) String() string {
	return fmt.Sprintf("examined %d conntrack entries, deleted %d (%d failed) in %s", r.Examined, r.Deleted, r.Failed, r.Duration.Round(time.Microsecond))
}

// entry is what the decision needs of a conntrack entry.
type entry struct {
	proto              uint8
	origSrc, origDst   netip.Addr
	replySrc, replyDst netip.Addr
	statusSNAT         bool   // IPS_SRC_NAT in the entry's status
	labels             []byte // CTA_LABELS: the label bitmap (unsigned longs of the host), nil without labels
	origTuple          []byte // CTA_TUPLE_ORIG's payload, as dumped (valid during the dump only)
}

// hasLabel reports whether the entry carries the label bit (the kernel's
// bitmap is of unsigned longs, in the host's byte order; 64-bit hosts).
func (e entry) hasLabel(bit int) bool {
	if bit < 0 || len(e.labels) < (bit/64+1)*8 {
		return false
	}
	return binary.NativeEndian.Uint64(e.labels[bit/64*8:])&(1<<(bit%64)) != 0
}

// verdict is the outcome of judge: keep (for one of several reasons) or
// delete.
type verdict uint8

const (
	keepProtocol    verdict = iota // a protocol the mode leaves alone
	keepBroken                     // addresses missing or of mixed families
	keepLocalDst                   // to a local address of the node: never through the agent's rule
	keepLocalSrc                   // from the node itself: masquerade would not change its source
	keepUnhandled                  // the agent does not handle the destination now
	keepUnchanged                  // the decision for the destination did not change
	keepAgrees                     // the entry's NAT state is the new decision already
	keepForeignSNAT                // source-NATed to an address that is not the node's: another table's SNAT
	keepUnmarked                   // source-NATed, but not by the agent's rule (no mark): another chain's masquerade
	deleteStale                    // the decision changed and the entry disagrees with it
)

var verdictNames = [...]string{"keep: protocol", "keep: broken", "keep: local destination", "keep: local source",
	"keep: unhandled", "keep: unchanged", "keep: agrees", "keep: foreign snat", "keep: unmarked", "delete"}

func (v verdict) String() string {
	if int(v) < len(verdictNames) {
		return verdictNames[v]
	}
	return fmt.Sprintf("verdict(%d)", v)
}

// judge decides one entry. The destination the agent's rule saw is the
// reply tuple's source: the original destination after any DNAT (a
// Service's backend), since the rule runs at postrouting; without DNAT the
// two are equal. The source it saw is the original source (the pod).
// The entry was source-NATed when its reply goes to another
// address than the original source, or its status has IPS_SRC_NAT.
//
// mark is the conntrack label bit with which the old table's masquerade
// rules marked the connections they masqueraded, or -1 when they did not
// (then an entry masqueraded to a local address is taken for the agent's,
// as before marks). With a mark, an entry the new rules do not masquerade
// is deleted when it carries the mark, whatever the old decision, and kept
// when it does not: someone else (kube-proxy's KUBE-MARK-MASQ, a CNI)
// masqueraded it, or no one did.
//
// An entry the new rules masquerade is deleted only when the decision for
// its destination changed and no one source-NATed it.
func judge(e entry, mode Mode, old, new Decider, isLocal func(netip.Addr) bool, mark int) verdict {
	if mode == ModeNone || (mode != ModeAll && e.proto != unix.IPPROTO_UDP) {
		return keepProtocol
	}
	if !e.origSrc.IsValid() || !e.origDst.IsValid() || !e.replySrc.IsValid() || !e.replyDst.IsValid() ||
		e.origSrc.Is4() != e.origDst.Is4() || e.origSrc.Is4() != e.replySrc.Is4() || e.origSrc.Is4() != e.replyDst.Is4() {
		return keepBroken
	}
	dst := e.replySrc
	if isLocal(e.origDst) || isLocal(dst) {
		return keepLocalDst
	}
	if isLocal(e.origSrc) {
		return keepLocalSrc
	}
	flow := Flow{Src: e.origSrc, Dst: dst}
	masq, handled := new(flow)
	if !handled {
		return keepUnhandled
	}
	snat := e.statusSNAT || e.replyDst != e.origSrc
	if !masq && mark >= 0 {
		switch {
		case e.hasLabel(mark):
			return deleteStale
		case snat:
			return keepUnmarked
		}
		return keepAgrees
	}
	was, wasHandled := old(flow)
	if wasHandled && was == masq || !wasHandled && !masq {
		// Not handled before is "not masqueraded by the agent".
		return keepUnchanged
	}
	if snat == masq {
		return keepAgrees
	}
	if snat && !isLocal(e.replyDst) {
		return keepForeignSNAT
	}
	return deleteStale
}

// judgeNATedTo decides one entry for CleanupNATedTo: delete it when it is
// source-NATed to one of the addresses to (its reply goes there rather
// than to its original source) and carries the mark (mark -1: any).
func judgeNATedTo(e entry, mode Mode, to map[netip.Addr]bool, mark int) verdict {
	if mode == ModeNone || (mode != ModeAll && e.proto != unix.IPPROTO_UDP) {
		return keepProtocol
	}
	if !e.origSrc.IsValid() || !e.replyDst.IsValid() {
		return keepBroken
	}
	if e.replyDst == e.origSrc || !to[e.replyDst] {
		return keepAgrees
	}
	if mark >= 0 && !e.hasLabel(mark) {
		return keepUnmarked
	}
	return deleteStale
}

// localAddrs is the set of the node's local addresses: the prefixes of
// type local in the kernel's local routing table (what `fib daddr type
// local` matches), host routes in a map, wider ones (127.0.0.0/8) in a
// list.
type localAddrs struct {
	hosts    map[netip.Addr]struct{}
	prefixes []netip.Prefix
}

func (l *localAddrs) add(p netip.Prefix) {
	p = p.Masked()
	if p.IsSingleIP() {
		if l.hosts == nil {
			l.hosts = map[netip.Addr]struct{}{}
		}
		l.hosts[p.Addr()] = struct{}{}
		return
	}
	l.prefixes = append(l.prefixes, p)
}

func (l *localAddrs) contains(a netip.Addr) bool {
	if _, ok := l.hosts[a]; ok {
		return true
	}
	for _, p := range l.prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

var errNilDecider = errors.New("conntrack: nil Decider")

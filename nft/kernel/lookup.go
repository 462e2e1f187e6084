package kernel

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strconv"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// The interval-set lookups of Linux (nft_set_rbtree), as IntervalLookup
// learns them.
const (
	lookupUnknown = iota
	// lookupTree walks the tree of elements, locklessly, and may answer
	// "not in the set" while a transaction adds or deletes the start
	// element of an address's interval (TestIntervalLookupDuringCommit).
	lookupTree
	// lookupArray searches a sorted array of the intervals built at each
	// commit ("nft_set_rbtree: translate rbtree to array for binary
	// search", nf-next 2026-01-22: Linux 7.0, 6.18.14, 6.19.4): a packet
	// sees the set as it was before a transaction or after it.
	lookupArray
)

// lookupTable is the prefix of IntervalLookup's tables; a random suffix
// each time, as the probe's (probeTable).
const lookupTable = nft.TableName + "-lookup-"

// lookupInterval is the one interval of IntervalLookup's set.
var lookupInterval = [2]nft.Bound{{Addr: netip.MustParseAddr("192.0.2.0")}, {Addr: netip.MustParseAddr("192.0.3.0"), End: true}}

// IntervalLookup says whether the kernel's interval sets look up in an
// array built at each commit, from the kernel's answer, once (a kernel does
// not change under a process). In a table of its own, owned by a socket of
// its own (so that no other process can change it, and gone with that
// socket), one set holds one interval, 192.0.2.0/24; a get of its start
// with the interval-end flag then tells: the tree's get answers with the
// start element itself (an exact key match, whatever the flag), the
// array's with the end element of the interval that holds the key. The
// table is deleted before it returns. A kernel that refuses an owned table
// is older than 5.12, so has the tree's (the array came with 7.0, 6.18.14
// and 6.19.4), and so has one that answers otherwise. An error: the kernel
// did not answer (the agent then keeps adjacent CIDRs apart, which is right
// on either, and asks again at its next sync).
func (n *Netlink) IntervalLookup() (array bool, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.lookup != lookupUnknown {
		return n.lookup == lookupArray, nil
	}
	conn, err := dial(n.NetNS)
	if err != nil {
		return false, err
	}
	defer conn.Close() // the owned table goes with it, if the deletion below failed
	name := lookupTable + strconv.FormatUint(rand.Uint64(), 36)
	b := &batch{}
	cc := b.recorder()
	cc.AddSet(&nftables.Set{Table: &nftables.Table{Family: nftables.TableFamilyINet, Name: name}, Name: "s", KeyType: nftables.TypeIPAddr, Interval: true, KeyByteOrder: binaryutil.BigEndian}, nil)
	if err := cc.Flush(); err != nil {
		return false, err
	}
	b.msgs = append([]netlink.Message{tableMsg(unix.NFT_MSG_NEWTABLE, name, netlink.Create|netlink.Excl, tableFlagOwner)}, b.msgs...)
	b.msgs = append(b.msgs, rawMessage(unix.NFT_MSG_NEWSETELEM, netlink.Request|netlink.Create, elementsPayloadIn(name, "s", lookupInterval[:])))
	b.op = make([]int, len(b.msgs))
	failed, err := b.send(conn, 0)
	if failed == 0 && (errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP)) {
		n.lookup = lookupTree // no owned tables: before 5.12
		n.debug("the kernel refuses an owned table: its interval-set lookup is the tree's", "err", err)
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("create table inet %s: %w", name, err)
	}
	defer (&batch{msgs: []netlink.Message{tableMsg(unix.NFT_MSG_DELTABLE, name, 0, 0)}, op: []int{0}}).send(conn, 0)
	got, found, plain, err := getBoundsIn(conn, name, "s", []nft.Bound{{Addr: lookupInterval[0].Addr, End: true}})
	if err != nil {
		return false, fmt.Errorf("get element %s of table inet %s: %w", lookupInterval[0].Addr, name, err)
	}
	// Any answer but the array's is taken for the tree's, for good: adjacent
	// CIDRs apart are right on either lookup. (The get changed with the
	// lookup, in one series: "use binary search array in get command"
	// needs the array.)
	n.lookup = lookupTree
	if plain && found[0] && got[0] == lookupInterval[1] {
		n.lookup = lookupArray
	}
	n.debug("learnt the kernel's interval-set lookup from its answer to a get", "answer", got[0], "found", found[0], "array", n.lookup == lookupArray)
	return n.lookup == lookupArray, nil
}

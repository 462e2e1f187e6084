package kernel

import (
	"bytes"
	"context"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Watch calls notify, from Watch's goroutine, after every transaction of
// another process that touched table inet ip-masq-agent and whenever
// notifications were lost (one that a Read drains first is not: that
// read compares the table with the wanted one itself). It shares the read path's monitor socket (monitor.go), which
// leaves the notification group during our own commits; the verifying read
// that follows every Send covers that window. Watch returns when ctx is
// done (nil) or the socket fails.
//
// It reads raw netlink rather than google/nftables' monitor, which (v0.3.0)
// decodes every element of every set, cannot filter by object type, closes
// its channel on a receive buffer overrun and cannot be stopped when lasting.
func (n *Netlink) Watch(ctx context.Context, notify func(nft.Event)) error {
	n.mu.Lock()
	m, err := n.monitor()
	n.mu.Unlock()
	if err != nil {
		return err
	}
	err = m.watch(ctx, notify)
	if err != nil && ctx.Err() == nil {
		// Start the next watch on a new subscription.
		n.mu.Lock()
		if n.mon == m {
			n.mon = nil
			m.close()
		}
		n.mu.Unlock()
	}
	return err
}

// touchesTable reports whether a notification concerns table inet
// ip-masq-agent. In every nftables object message the table's name is
// attribute 1 (NFTA_TABLE_NAME, NFTA_CHAIN_TABLE, NFTA_RULE_TABLE, ...).
func touchesTable(typ int, data []byte) bool {
	if _, ok := messageNames[typ]; !ok || len(data) < 4 || data[0] != unix.NFPROTO_INET {
		return false
	}
	ad, err := netlink.NewAttributeDecoder(data[4:])
	if err != nil {
		return false
	}
	for ad.Next() {
		if ad.Type() == 1 {
			return bytes.Equal(bytes.TrimRight(ad.Bytes(), "\x00"), []byte(nft.TableName))
		}
	}
	return false
}

var messageNames = map[int]string{
	unix.NFT_MSG_NEWTABLE: "add table", unix.NFT_MSG_DELTABLE: "delete table",
	unix.NFT_MSG_NEWCHAIN: "add chain", unix.NFT_MSG_DELCHAIN: "delete chain",
	unix.NFT_MSG_NEWRULE: "add rule", unix.NFT_MSG_DELRULE: "delete rule",
	unix.NFT_MSG_NEWSET: "add set", unix.NFT_MSG_DELSET: "delete set",
	unix.NFT_MSG_NEWSETELEM: "add elements", unix.NFT_MSG_DELSETELEM: "delete elements",
	unix.NFT_MSG_NEWOBJ: "add object", unix.NFT_MSG_DELOBJ: "delete object",
	unix.NFT_MSG_NEWFLOWTABLE: "add flowtable", unix.NFT_MSG_DELFLOWTABLE: "delete flowtable",
}

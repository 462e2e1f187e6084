package nft

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"syscall"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Change is a transaction of another process that touched the agent's table,
// or a loss of events after which anything may have happened.
type Change struct {
	What string // e.g. "delete table", "add rule", "delete elements"; or why events were lost
	Lost bool   // events were lost (receive buffer overrun)
}

// watchBuffer is the monitor socket's receive buffer. The agent's own
// commit of 100,000 CIDRs is echoed as about 6 MiB of notifications.
const watchBuffer = 32 << 20

// Watch subscribes to the kernel's nftables notifications in the applier's
// namespace and calls onChange, from Watch's goroutine, once per foreign
// transaction that touched table inet ip-masq-agent, and when events were
// lost. Until Watch returns, Apply trusts that the kernel holds what it
// last applied unless onChange was called, and so sends nothing for an
// unchanged ruleset. Watch returns when ctx is done (nil) or the socket fails.
//
// It reads raw netlink rather than google/nftables' monitor, which (v0.3.0)
// decodes every element of every set, cannot filter by object type, closes
// its channel on a receive buffer overrun and cannot be stopped when lasting.
// The agent's own transactions are recognised by their netlink port id,
// which the kernel puts in the header of every notification it sends for a
// transaction (the process id in NEWGEN is a thread id, less reliable).
func (a *Applier) Watch(ctx context.Context, onChange func(Change)) error {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: a.NetNS})
	if err != nil {
		return fmt.Errorf("watch nftables: open netlink socket: %w", err)
	}
	defer conn.Close()
	if err := conn.JoinGroup(unix.NFNLGRP_NFTABLES); err != nil {
		return fmt.Errorf("watch nftables: join the nftables group: %w", err)
	}
	if err := setBuffer(conn, unix.SO_RCVBUFFORCE, unix.SO_RCVBUF, watchBuffer); err != nil {
		return fmt.Errorf("watch nftables: set receive buffer: %w", err)
	}
	// Anything may have happened before the subscription: trust nothing
	// applied so far; from now on every change is seen.
	a.mu.Lock()
	a.watching = true
	a.mu.Unlock()
	a.markDirty()
	defer func() {
		a.mu.Lock()
		a.watching = false
		a.mu.Unlock()
		a.markDirty()
	}()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()

	buf := make([]byte, 1<<20)
	var foreign []string // what foreign messages of the current transaction did
	for {
		msgs, err := receive(conn, buf)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, syscall.ENOBUFS):
			a.markDirty()
			foreign = nil
			onChange(Change{What: "notifications lost (receive buffer overrun)", Lost: true})
			continue
		case err != nil:
			return fmt.Errorf("watch nftables: receive: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Type>>8 != unix.NFNL_SUBSYS_NFTABLES {
				continue
			}
			typ := int(m.Header.Type & 0xff)
			if typ == unix.NFT_MSG_NEWGEN {
				// The end of a transaction.
				if len(foreign) > 0 {
					a.markDirty()
					onChange(Change{What: joinUnique(foreign)})
				}
				foreign = nil
				continue
			}
			if touchesTable(typ, m.Data) && !a.isOwn(m.Header.Pid) {
				foreign = append(foreign, messageNames[typ])
			}
		}
	}
}

func (a *Applier) markDirty() {
	a.mu.Lock()
	a.dirty = true
	a.changes++
	a.mu.Unlock()
}

func (a *Applier) isOwn(port uint32) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return port != 0 && slices.Contains(a.ownPorts, port)
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
			return bytes.Equal(bytes.TrimRight(ad.Bytes(), "\x00"), []byte(TableName))
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

func joinUnique(ss []string) string {
	slices.Sort(ss)
	ss = slices.Compact(ss)
	out := ""
	for i, s := range ss {
		if i > 0 {
			out += ", "
		}
		out += s
	}
	return out
}

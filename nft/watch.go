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

// Event is a notification that the table may have changed: a transaction
// (anyone's) that touched it, or a loss of notifications after which
// anything may have happened. It says nothing about who: the receiver
// reads the table back and compares.
type Event struct {
	What string // e.g. "delete table, add rule"; or why notifications were lost
	Lost bool   // notifications were lost (receive buffer overrun, generation gap)
}

// watchBuffer is the monitor socket's receive buffer.
const watchBuffer = 32 << 20

// Watch subscribes to the kernel's nftables notifications and calls notify,
// from Watch's goroutine, after every transaction that touched table inet
// ip-masq-agent and whenever notifications were lost. While it runs, Send
// leaves the notification group for the length of its own transaction:
// otherwise the kernel builds a notification per element of it for this
// socket; the verifying read that follows every Send covers that window.
// Watch returns when ctx is done (nil) or the socket fails.
//
// It reads raw netlink rather than google/nftables' monitor, which (v0.3.0)
// decodes every element of every set, cannot filter by object type, closes
// its channel on a receive buffer overrun and cannot be stopped when lasting.
func (n *Netlink) Watch(ctx context.Context, notify func(Event)) error {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: n.NetNS})
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
	lastGen := uint32(0) // 0: unknown
	paused := false
	n.mu.Lock()
	n.pause = func() func() {
		_ = conn.LeaveGroup(unix.NFNLGRP_NFTABLES)
		return func() {
			_ = conn.JoinGroup(unix.NFNLGRP_NFTABLES)
			paused = true // the generations of our own commit were not seen
		}
	}
	n.mu.Unlock()
	defer func() {
		n.mu.Lock()
		n.pause = nil
		n.mu.Unlock()
	}()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	// Anything may have happened before the subscription.
	notify(Event{What: "watch started", Lost: true})

	buf := make([]byte, 1<<20)
	var touched []string // what the current transaction did to the table
	for {
		msgs, err := receive(conn, buf)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, syscall.ENOBUFS):
			// The kernel drops notifications silently until the queue
			// has room: drain it first, then have the table verified.
			drain(conn, buf)
			touched, lastGen = nil, 0
			notify(Event{What: "notifications lost (receive buffer overrun)", Lost: true})
			continue
		case err != nil:
			return fmt.Errorf("watch nftables: receive: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Type>>8 != unix.NFNL_SUBSYS_NFTABLES {
				continue
			}
			typ := int(m.Header.Type & 0xff)
			if typ != unix.NFT_MSG_NEWGEN {
				if touchesTable(typ, m.Data) {
					touched = append(touched, messageNames[typ])
				}
				continue
			}
			// The end of a transaction.
			n.mu.Lock()
			gap := !paused && lastGen != 0
			paused = false
			n.mu.Unlock()
			gen, ok := genID(m.Data)
			switch {
			case len(touched) > 0:
				notify(Event{What: joinUnique(touched)})
			case ok && gap && gen != lastGen+1:
				notify(Event{What: fmt.Sprintf("generation %d follows %d: notifications lost", gen, lastGen), Lost: true})
			}
			touched, lastGen = nil, gen
		}
	}
}

// drain reads and drops whatever the socket holds.
func drain(conn *netlink.Conn, buf []byte) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return
	}
	_ = raw.Read(func(fd uintptr) bool {
		for {
			if _, _, err := unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT); err == unix.EAGAIN {
				return true
			}
		}
	})
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
	ss = slices.Clone(ss)
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

package kernel

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// monitor is the socket subscribed to the kernel's nftables notifications.
// It answers one question for the read path: has a transaction of another
// process touched table inet ip-masq-agent since the last time we asked?
// Commits to other tables (kube-proxy's, a CNI's, firewalld's) do not
// count: on a busy node they come every second or faster.
//
// The kernel sends a transaction's notifications before it releases its
// commit lock, so after a fence (which takes that lock) every transaction
// that started before it has its notifications queued here: draining the
// socket then tells exactly which of them touched the table.
type monitor struct {
	mu      sync.Mutex
	conn    *netlink.Conn
	buf     []byte
	touched touch       // what foreign transactions did to the table (touch.go)
	lost    bool        // notifications were lost: anything may have happened
	what    []string    // what the transaction under way did to the table
	lastGen uint32      // the last transaction's generation; 0: unknown
	skipped bool        // our own commit ran while paused: its generations were not seen
	watched bool        // a Watch runs
	ours    uint32      // the port id of our commit socket: its transactions are no touch
	events  []nft.Event // for the Watch, delivered outside mu
}

// watchBuffer is the monitor socket's receive buffer.
const watchBuffer = 32 << 20

func openMonitor(netns int) (*monitor, error) {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: netns})
	if err != nil {
		return nil, fmt.Errorf("watch nftables: open netlink socket: %w", err)
	}
	if err := conn.JoinGroup(unix.NFNLGRP_NFTABLES); err != nil {
		conn.Close()
		return nil, fmt.Errorf("watch nftables: join the nftables group: %w", err)
	}
	if err := setBuffer(conn, unix.SO_RCVBUFFORCE, unix.SO_RCVBUF, watchBuffer); err != nil {
		conn.Close()
		return nil, fmt.Errorf("watch nftables: set receive buffer: %w", err)
	}
	// Anything may have happened before the subscription.
	return &monitor{conn: conn, buf: make([]byte, 64<<10), lost: true}, nil
}

// take drains what the kernel has queued and reports whether the table
// was touched, and whether notifications were lost (so that it may have
// been), since the last take.
func (m *monitor) take() (touched, lost bool, err error) {
	t, lost, err := m.takeTouch()
	return t.any(), lost, err
}

// takeTouch is take that says what the foreign transactions did.
func (m *monitor) takeTouch() (touched touch, lost bool, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	raw, err := m.conn.SyscallConn()
	if err != nil {
		return touch{whole: true}, true, err
	}
	// Control, not Read: a running Watch may be parked in Read.
	var derr error
	if err := raw.Control(func(fd uintptr) { derr = m.drain(int(fd)) }); err != nil {
		return touch{whole: true}, true, err
	}
	// What a read finds first needs no event: the read it is part of
	// compares the table with the wanted one.
	m.events = nil
	touched, lost = m.touched, m.lost
	m.touched, m.lost = touch{}, false
	return touched, lost, derr
}

// leave leaves the notification group for the length of our own commit
// (rejoin ends it): otherwise the kernel builds one notification per
// element of it for this socket.
func (m *monitor) leave() {
	m.mu.Lock()
	defer m.mu.Unlock()
	_ = m.conn.LeaveGroup(unix.NFNLGRP_NFTABLES)
}

// stay keeps the group joined for our own commit of a few elements:
// the monitor tells our transaction's notifications from others' by the
// port id of the socket that sent it.
func (m *monitor) stay(port uint32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ours = port
}

// rejoin joins the notification group again after our own commit.
// Whatever happened meanwhile counts as a touch: the read after our
// commit reads the whole table anyway.
func (m *monitor) rejoin() {
	m.mu.Lock()
	defer m.mu.Unlock()
	_ = m.conn.JoinGroup(unix.NFNLGRP_NFTABLES)
	m.lost, m.skipped = true, true
}

// drain reads every queued notification, without waiting; m.mu is held.
func (m *monitor) drain(fd int) error {
	for {
		n, from, err := unix.Recvfrom(fd, m.buf, unix.MSG_DONTWAIT)
		switch {
		case err == nil && !fromKernel(from):
			continue // another process's datagram: no notification
		case errors.Is(err, unix.EAGAIN):
			return nil
		case errors.Is(err, unix.ENOBUFS):
			// The kernel dropped notifications until the queue had
			// room: anything may have happened.
			m.what, m.lastGen, m.lost = nil, 0, true
			m.emit(nft.Event{What: "notifications lost (receive buffer overrun)", Lost: true})
			continue
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			m.lost = true
			return fmt.Errorf("watch nftables: receive: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(m.buf[:n])
		if err != nil {
			m.lost = true // the kernel's, yet unreadable: skipped
			continue
		}
		for _, msg := range msgs {
			m.message(msg)
		}
	}
}

// message takes one notification; m.mu is held.
func (m *monitor) message(msg syscall.NetlinkMessage) {
	if msg.Header.Type>>8 != unix.NFNL_SUBSYS_NFTABLES {
		return
	}
	typ := int(msg.Header.Type & 0xff)
	if typ != unix.NFT_MSG_NEWGEN {
		// The kernel writes the port id of the socket that sent the
		// transaction into each of its notifications; only the kernel's
		// datagrams are taken (drain), so this is no one's claim.
		if m.ours != 0 && msg.Header.Pid == m.ours {
			return
		}
		if touchesTable(typ, msg.Data) {
			m.what = append(m.what, messageNames[typ])
			m.touched.note(typ, msg.Data)
		}
		return
	}
	// The end of a transaction.
	gen, ok := genID(msg.Data)
	switch {
	case len(m.what) > 0:
		m.emit(nft.Event{What: joinUnique(m.what)})
	case ok && !m.skipped && m.lastGen != 0 && gen != m.lastGen+1:
		m.lost = true
		m.emit(nft.Event{What: fmt.Sprintf("generation %d follows %d: notifications lost", gen, m.lastGen), Lost: true})
	}
	m.what, m.lastGen, m.skipped = nil, gen, false
}

func (m *monitor) emit(e nft.Event) {
	if m.watched {
		m.events = append(m.events, e)
	}
}

// watch calls notify for every foreign transaction that touches the table
// and every loss of notifications, until ctx is done.
func (m *monitor) watch(ctx context.Context, notify func(nft.Event)) error {
	m.mu.Lock()
	if m.watched {
		m.mu.Unlock()
		return errors.New("watch nftables: already watching")
	}
	m.watched = true
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		m.watched, m.events = false, nil
		m.mu.Unlock()
	}()
	raw, err := m.conn.SyscallConn()
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { _ = m.conn.SetReadDeadline(aLongTimeAgo) })
	defer stop()
	defer m.conn.SetReadDeadline(noDeadline)
	notify(nft.Event{What: "watch started", Lost: true})
	var derr error
	err = raw.Read(func(fd uintptr) bool {
		m.mu.Lock()
		derr = m.drain(int(fd))
		events := m.events
		m.events = nil
		m.mu.Unlock()
		for _, e := range events {
			notify(e) // without mu: notify may read the table
		}
		return derr != nil // false: wait until there is more to read
	})
	switch {
	case ctx.Err() != nil:
		return nil
	case derr != nil:
		return derr
	case errors.Is(err, os.ErrDeadlineExceeded):
		return errors.New("watch nftables: stopped")
	}
	return err
}

func (m *monitor) close() {
	if m != nil {
		m.conn.Close()
	}
}

// fence waits until every transaction under way in the namespace has
// finished: it sends an empty transaction (a batch's begin and end, with
// nothing between), for which the kernel takes its commit lock (every
// kernel from 4.19 on, before it looks at the messages) and, with nothing
// to commit, releases it: no generation, no notification. The kernel
// handles a batch within the send that carries it, and answers an empty
// one only with an error; the generation asked for next is the answer
// that ends the wait. A transaction the kernel refuses would fence too,
// but the kernel's abort waits for an RCU grace period (10-20 ms), for
// every read of a table nobody owns.
func fence(conn transport) error {
	seq := rand.Uint32()>>1 + 1
	ends := func(typ uint16, seq uint32) netlink.Message {
		return netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(typ), Flags: netlink.Request, Sequence: seq},
			Data: nfgenmsg(unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES)}
	}
	batch := []netlink.Message{ends(unix.NFNL_MSG_BATCH_BEGIN, seq), ends(unix.NFNL_MSG_BATCH_END, seq+1)}
	if err := sendAll(conn, batch, 64); err != nil {
		return fmt.Errorf("wait for the nftables commit lock: %w", err)
	}
	req, err := conn.Send(message(unix.AF_UNSPEC, unix.NFT_MSG_GETGEN, netlink.Request))
	if err != nil {
		return fmt.Errorf("wait for the nftables commit lock: %w", err)
	}
	if err := conn.SetReadDeadline(time.Now().Add(replyTimeout)); err != nil {
		return err
	}
	defer conn.SetReadDeadline(time.Time{})
	buf, from := make([]byte, 8<<10), datagramsOf(conn)
	for {
		msgs, err := receive(from, buf)
		if err != nil {
			return fmt.Errorf("wait for the nftables commit lock: %w", err)
		}
		for _, m := range msgs {
			s := m.Header.Seq
			if m.Header.Type == unix.NLMSG_ERROR && len(m.Data) >= 4 && (s == seq || s == seq+1 || s == req.Header.Sequence) {
				if code := int32(binary.NativeEndian.Uint32(m.Data[:4])); code != 0 {
					return fmt.Errorf("wait for the nftables commit lock: %w", syscall.Errno(-code))
				}
			}
			if s == req.Header.Sequence {
				return nil
			}
		}
	}
}

var (
	aLongTimeAgo = time.Unix(1, 0)
	noDeadline   time.Time
)

package nft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// batch collects the messages of one nftables transaction, each with what
// it does, and sends them itself (send) rather than with
// nftables.Conn.Flush: google/nftables v0.3.0 cannot say which message
// failed, leaves a lasting connection out of step after a failed Flush,
// overflows the default socket buffers on large batches (EMSGSIZE on send,
// ENOBUFS on receive although the transaction committed), and has the
// kernel echo every message back. Messages are still encoded by
// google/nftables: a Conn whose Flush only records them (see newBatch).
type batch struct {
	cc   *nftables.Conn
	msgs []netlink.Message
	what []string
	err  error
}

func newBatch() *batch {
	b := &batch{}
	ack := []netlink.Message{{Header: netlink.Header{Type: netlink.Error}, Data: make([]byte, 4)}}
	b.cc, _ = nftables.New(nftables.WithTestDial(func(req []netlink.Message) ([]netlink.Message, error) {
		if req == nil { // Flush waiting for an ack
			return ack, nil
		}
		// Drop the batch begin and end; send adds its own.
		b.msgs = append(b.msgs, req[1:len(req)-1]...)
		return nil, nil
	}))
	return b
}

// add records the messages f has google/nftables encode.
func (b *batch) add(what string, f func(cc *nftables.Conn) error) {
	if b.err != nil {
		return
	}
	n := len(b.msgs)
	if err := f(b.cc); err != nil {
		b.err = fmt.Errorf("%s: %w", what, err)
		return
	}
	if err := b.cc.Flush(); err != nil {
		b.err = fmt.Errorf("%s: %w", what, err)
		return
	}
	for range b.msgs[n:] {
		b.what = append(b.what, what)
	}
}

func (b *batch) fail(err error) {
	if b.err == nil {
		b.err = err
	}
}

func (b *batch) addMessage(what string, m netlink.Message) {
	b.msgs = append(b.msgs, m)
	b.what = append(b.what, what)
}

func (b *batch) size() int {
	n := 0
	for _, m := range b.msgs {
		n += 16 + len(m.Data) // nlmsghdr + payload
	}
	return n
}

// replyTimeout bounds the wait for the kernel's answer to one batch.
const replyTimeout = 30 * time.Second

// send sends the batch as one transaction on conn and waits for
// the kernel's verdict. Only the last message asks for an ack; errors are
// reported whatever the flags, so one ack means the whole batch committed.
// own, if not nil, learns the socket's netlink port id before anything is
// sent: the kernel's notifications of the transaction carry it.
func (b *batch) send(conn *netlink.Conn, own func(portID uint32)) error {
	if len(b.msgs) == 0 {
		return nil
	}
	// Acks and errors carry only the header of the failed message, not all
	// of it: an element message can be 40 KiB.
	if err := conn.SetOption(netlink.CapAcknowledge, true); err != nil {
		return fmt.Errorf("set NETLINK_CAP_ACK: %w", err)
	}
	_ = conn.SetOption(netlink.ExtendedAcknowledge, true) // error strings, where the kernel has them
	size := b.size() + 4096
	if err := setBuffer(conn, unix.SO_SNDBUFFORCE, unix.SO_SNDBUF, size); err != nil {
		return fmt.Errorf("set socket send buffer to %d bytes: %w", size, err)
	}

	if own != nil {
		own(conn.PID())
	}
	seq := rand.Uint32()>>1 + 1
	begin := netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_MSG_BATCH_BEGIN), Flags: netlink.Request, Sequence: seq},
		Data:   nfgenmsg(unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES),
	}
	out := make([]netlink.Message, 0, len(b.msgs)+2)
	out = append(out, begin)
	for i, m := range b.msgs {
		m.Header.Sequence = seq + 1 + uint32(i)
		m.Header.Flags &^= netlink.Acknowledge | unix.NLM_F_ECHO
		if i == len(b.msgs)-1 {
			m.Header.Flags |= netlink.Acknowledge
		}
		out = append(out, m)
	}
	last := seq + uint32(len(b.msgs))
	out = append(out, netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_MSG_BATCH_END), Flags: netlink.Request, Sequence: last + 1},
		Data:   nfgenmsg(unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES),
	})
	if _, err := conn.SendMessages(out); err != nil {
		return fmt.Errorf("send %d messages (%d bytes): %w", len(out), size, err)
	}
	return b.wait(conn, seq, last)
}

// wait reads the kernel's replies until the ack or error of the last
// message, or an error on the batch itself, and names the failed messages.
func (b *batch) wait(conn *netlink.Conn, begin, last uint32) error {
	if err := conn.SetReadDeadline(time.Now().Add(replyTimeout)); err != nil {
		return err
	}
	buf := make([]byte, 1<<16)
	var errs []error
	for {
		msgs, err := receive(conn, buf)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				err = fmt.Errorf("no answer from the kernel within %s", replyTimeout)
			}
			return errors.Join(append(errs, fmt.Errorf("receive the kernel's answer: %w", err))...)
		}
		for _, m := range msgs {
			if m.Header.Type != unix.NLMSG_ERROR || len(m.Data) < 4 {
				continue
			}
			code := int32(binary.NativeEndian.Uint32(m.Data[:4]))
			s := m.Header.Seq
			switch {
			case code != 0 && s == begin:
				errs = append(errs, fmt.Errorf("transaction refused: %w", syscall.Errno(-code)))
			case code != 0 && s > begin && s <= last:
				errs = append(errs, fmt.Errorf("%s: %w", b.what[s-begin-1], syscall.Errno(-code)))
			}
			if s == last || (s == begin && code != 0) {
				return firstOf(errs)
			}
		}
	}
}

// firstOf returns the first error and how many more messages failed: when
// one message is refused the kernel reports the rest of the batch too.
func firstOf(errs []error) error {
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	return fmt.Errorf("%w (and %d more messages of the transaction refused)", errs[0], len(errs)-1)
}

// receive reads one datagram and splits it into netlink messages. It reads
// the socket itself because netlink.Conn.Receive turns an error message
// into an error without its sequence number, which says what failed.
func receive(conn *netlink.Conn, buf []byte) ([]syscall.NetlinkMessage, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return nil, err
	}
	var n int
	var rerr error
	if err := raw.Read(func(fd uintptr) bool {
		n, _, rerr = unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT)
		return rerr != unix.EAGAIN
	}); err != nil {
		return nil, err
	}
	if rerr != nil {
		return nil, rerr
	}
	msgs, err := syscall.ParseNetlinkMessage(buf[:n])
	if err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	return msgs, nil
}

// setBuffer sets a socket buffer size, past the system's limit (net.core.
// wmem_max / rmem_max) when the process has CAP_NET_ADMIN, which it needs
// for nftables anyway.
func setBuffer(conn *netlink.Conn, force, plain, size int) error {
	raw, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = raw.Control(func(fd uintptr) {
		if cur, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, plain); err == nil && cur >= size {
			return
		}
		if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, force, size); serr != nil {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, plain, size)
		}
	})
	if err != nil {
		return err
	}
	return serr
}

package kernel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"syscall"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// transport is the netfilter socket as the read path, the batch send and
// the fence use it (knftables' execer seam): *netlink.Conn, or in tests a
// replay of a kernel's recorded datagrams (replay_test.go). Send numbers
// and sends one request; receive, sendAll and batch.send read, write and
// size datagrams through datagramsOf: on the socket itself (rawSocket),
// or through the transport when it implements datagrams (the replay).
type transport interface {
	Send(m netlink.Message) (netlink.Message, error)
	SetReadDeadline(t time.Time) error
	syscall.Conn
}

// datagrams is what receive, sendAll and batch.send do on a socket.
type datagrams interface {
	// readDatagram reads one datagram from the kernel into buf.
	readDatagram(buf []byte) (int, error)
	// writeDatagram writes one datagram to the kernel.
	writeDatagram(b []byte) error
	// growSendBuffer makes the send buffer at least size bytes.
	growSendBuffer(size int) error
}

// query is one nftables request and how its answers are taken; get and
// dump make one for family inet, ask sends it.
type query struct {
	typ    int
	family uint8
	attrs  []netlink.Attribute
	dump   bool // every part of a dump; else the one answer
	// keep, if set, keeps only the answers it accepts (its argument: the
	// payload after nfgenmsg), before they are copied: the chain dump
	// holds every chain of the family, the agent's or not.
	keep func([]byte) bool
	// acrossTables: the kernel resumes this dump by an index over every
	// table of the family (chains, objects, flowtables), and a
	// neighbour's commit between two parts shifts that index: one of our
	// objects would be skipped or listed twice. The kernel flags such a
	// dump (NLM_F_DUMP_INTR); it is taken again, a few times, then stale.
	acrossTables bool
}

// get is a request for one object of table family inet.
func get(typ int, attrs ...netlink.Attribute) query {
	return query{typ: typ, family: unix.NFPROTO_INET, attrs: attrs}
}

// dump is a request for every object of a kind of table family inet.
func dump(typ int, attrs ...netlink.Attribute) query {
	return query{typ: typ, family: unix.NFPROTO_INET, attrs: attrs, dump: true}
}

// of is q for tables of another family (iptables-nft's ip and ip6
// tables, read for original/).
func (q query) of(family uint8) query { q.family = family; return q }

// across is q for a dump across tables (see acrossTables) that keeps the
// answers keep accepts (nil: all).
func (q query) across(keep func([]byte) bool) query { q.acrossTables, q.keep = true, keep; return q }

// errDumpInterrupted: a dump that walks other tables' objects too was
// interrupted by a commit (NLM_F_DUMP_INTR).
var errDumpInterrupted = fmt.Errorf("%w: a dump was interrupted by a commit", nft.ErrStale)

// ask sends the request and returns the answers (every part of a dump).
// It reads the answers itself, with a 64 KiB buffer: the kernel sizes
// each part of a dump by the largest read the socket has seen (up to 32
// KiB), and a set's dump restarts its walk of the set for every part, so
// small reads (mdlayher/netlink peeks with one page) make reading 100,000
// elements several times slower in the kernel.
func (q query) ask(conn transport) ([]netlink.Message, error) {
	for try := 1; ; try++ {
		msgs, intr, err := q.once(conn)
		if err != nil || !intr || !q.acrossTables {
			return msgs, err
		}
		if try == 10 {
			return nil, errDumpInterrupted
		}
	}
}

// once sends the request once, and says whether the kernel flagged the
// dump as interrupted by a commit.
func (q query) once(conn transport) ([]netlink.Message, bool, error) {
	flags := netlink.Request
	if q.dump {
		flags |= netlink.Dump
	}
	req, err := conn.Send(message(q.family, q.typ, flags, q.attrs...))
	if err != nil {
		return nil, false, err
	}
	if err := conn.SetReadDeadline(time.Now().Add(replyTimeout)); err != nil {
		return nil, false, err
	}
	defer conn.SetReadDeadline(time.Time{})
	buf, from := make([]byte, 64<<10), datagramsOf(conn)
	var out []netlink.Message
	intr := false
	for {
		msgs, err := receive(from, buf)
		if err != nil {
			return nil, false, err
		}
		for _, m := range msgs {
			if m.Header.Seq != req.Header.Sequence {
				continue // an answer to an earlier request that timed out
			}
			intr = intr || m.Header.Flags&unix.NLM_F_DUMP_INTR != 0
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return out, intr, nil
			case unix.NLMSG_ERROR:
				if len(m.Data) >= 4 {
					if code := int32(binary.NativeEndian.Uint32(m.Data[:4])); code != 0 {
						return nil, false, syscall.Errno(-code)
					}
				}
				return out, intr, nil
			}
			if len(m.Data) >= 4 && (q.keep == nil || q.keep(m.Data[4:])) {
				out = append(out, netlink.Message{
					Header: netlink.Header{Type: netlink.HeaderType(m.Header.Type), Flags: netlink.HeaderFlags(m.Header.Flags),
						Sequence: m.Header.Seq, PID: m.Header.Pid},
					Data: slices.Clone(m.Data),
				})
			}
			if !q.dump {
				return out, intr, nil
			}
		}
	}
}

// receive reads one datagram from the kernel and splits it into netlink
// messages.
func receive(from datagrams, buf []byte) ([]syscall.NetlinkMessage, error) {
	n, err := from.readDatagram(buf)
	if err != nil {
		return nil, err
	}
	msgs, err := syscall.ParseNetlinkMessage(buf[:n])
	if err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	return msgs, nil
}

// datagramsOf is conn's datagrams: its own, or its socket's.
func datagramsOf(conn transport) datagrams {
	if d, ok := conn.(datagrams); ok {
		return d
	}
	return rawSocket{conn}
}

// rawSocket reads and writes the socket's datagrams itself:
// netlink.Conn.Receive turns an error message into an error without its
// sequence number, which says what failed, and takes any process's
// datagrams.
type rawSocket struct{ conn syscall.Conn }

func (s rawSocket) readDatagram(buf []byte) (int, error) {
	raw, err := s.conn.SyscallConn()
	if err != nil {
		return 0, err
	}
	var n int
	var rerr error
	if err := raw.Read(func(fd uintptr) bool {
		for {
			var from unix.Sockaddr
			n, from, rerr = unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT)
			if rerr == nil && !fromKernel(from) {
				continue // another process's datagram to our port: not an answer
			}
			return rerr != unix.EAGAIN
		}
	}); err != nil {
		return 0, err
	}
	return n, rerr
}

func (s rawSocket) writeDatagram(b []byte) error {
	raw, err := s.conn.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Write(func(fd uintptr) bool {
		serr = unix.Sendto(int(fd), b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
		return serr != unix.EAGAIN
	}); err != nil {
		return err
	}
	return serr
}

func (s rawSocket) growSendBuffer(size int) error {
	return setBuffer(s.conn, unix.SO_SNDBUFFORCE, unix.SO_SNDBUF, size)
}

// fromKernel reports whether a datagram came from the kernel (port id 0):
// any root process can send to a netlink socket's port or to the
// nftables group, and what it sends is neither an answer nor a
// notification.
func fromKernel(from unix.Sockaddr) bool {
	sa, ok := from.(*unix.SockaddrNetlink)
	return ok && sa.Pid == 0
}

// setBuffer sets a socket buffer size, past the system's limit (net.core.
// wmem_max / rmem_max) when the process has CAP_NET_ADMIN, which it needs
// for nftables anyway.
func setBuffer(conn syscall.Conn, force, plain, size int) error {
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

// generation returns the kernel's nftables generation id.
func generation(conn transport) (uint32, error) {
	// Through requestFamily's receive, which takes only the kernel's
	// datagrams (mdlayher/netlink's Execute takes any process's).
	msgs, err := query{typ: unix.NFT_MSG_GETGEN, family: unix.AF_UNSPEC}.ask(conn)
	if err != nil {
		return 0, err
	}
	for _, m := range msgs {
		if id, ok := genID(m.Data); ok {
			return id, nil
		}
	}
	return 0, errors.New("no generation id in the kernel's answer")
}

// genID reads NFTA_GEN_ID from a NEWGEN message's payload.
func genID(data []byte) (uint32, bool) {
	if len(data) < 4 {
		return 0, false
	}
	id, ok := uint32(0), false
	_ = decode(data, func(ad *netlink.AttributeDecoder) {
		if ad.Type() == unix.NFTA_GEN_ID {
			id, ok = ad.Uint32(), true
		}
	})
	return id, ok
}

package bench

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/conntrack"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft/kernel"
)

// The kernel's floor (issue 34's two missed targets): what the same
// kernel work costs a client that does nothing else, measured beside the
// agent's figures in the same row, so that a report says how much of a
// figure the agent could still remove. The floor's table is the agent's
// table (nft.Build of the same list) in the topology's ext namespace, so
// that it never meets the agent's; a bare kernel.Netlink, not owned,
// with no monitor, sends the plan from the table it sent last, reading
// nothing back.
type floor struct {
	ns     netns.NsHandle
	k      *kernel.Netlink
	tables [2]nft.Table // the row's two lists (oneCIDRApart)
	cur    int          // the index of the table in the kernel; -1: none
	mon    *genMonitor  // repair's, once asked
}

func newFloor(topo *testnet.Topology, n int) (*floor, error) {
	ns, err := netns.GetFromName(topo.ExtNS)
	if err != nil {
		return nil, err
	}
	f := &floor{ns: ns, k: &kernel.Netlink{NetNS: int(ns), NoOwner: true}, cur: -1}
	list := cidrList(4, 0, n)
	for i := range f.tables {
		c := config.Default(config.Flags{})
		c.NonMasqueradeCIDRs = list
		if i == 1 {
			c.NonMasqueradeCIDRs = oneChanged(4, list)
		}
		c.CIDRLimit = max(n, 64)
		f.tables[i] = nft.Build(c, agentOptions(true)) // the daemon's defaults
	}
	return f, nil
}

func (f *floor) Close() error {
	if f.mon != nil {
		f.mon.close()
	}
	err := f.k.Close()
	return errors.Join(err, f.ns.Close())
}

// set puts table i in the kernel (a create when there is none) and
// returns the CPU time of the thread that sent it, from before the send
// to the kernel's ack: for a plan of a few elements, the kernel's commit
// in the sender's context (the batch is encoded in microseconds; what
// the kernel defers to its workers and to RCU, freeing the old lookup
// array and elements, is in neither this nor the agent's figure).
func (f *floor) set(i int) (time.Duration, error) {
	p, err := f.plan(i)
	if err != nil {
		return 0, err
	}
	took, err := onThread(func() error {
		_, err := f.k.Send(p, 0)
		return err
	})
	if err != nil {
		f.cur = -1
		return 0, err
	}
	f.cur = i
	return took, nil
}

// plan is the plan from the table in the kernel to table i.
func (f *floor) plan(i int) (nft.Plan, error) {
	var found *nft.Table
	if f.cur >= 0 {
		found = &f.tables[f.cur]
	}
	return nft.PlanFor(found, f.tables[i])
}

// repair deletes the floor's table as the live part's trials delete the
// agent's (deleteTable: a google/nftables connection that closes its
// socket after the ack, and the kernel, at that close, frees the deleted
// table under the namespace's commit lock), and sends the create, planned
// beforehand, from the kernel.Netlink, whose socket lasts as the agent's
// does, as soon as the monitor reads the delete's notification, without
// waiting for the deleter's close. Both ends are timed as the agent's
// repair is: from the delete's commit (the earlier of the ack and the
// notification) to the notification of the create's commit. The agent
// does more between the two (it reads, re-reads its file, builds and
// plans), so it cannot beat the floor beyond the noise of the machine.
func (f *floor) repair(ctx context.Context) (time.Duration, error) {
	if f.cur < 0 {
		if _, err := f.set(0); err != nil {
			return 0, err
		}
	}
	if f.mon == nil {
		m, err := newGenMonitor(int(f.ns))
		if err != nil {
			return 0, err
		}
		f.mon = m
	}
	i := f.cur
	f.cur = -1
	p, err := f.plan(i) // the create
	if err != nil {
		return 0, err
	}
	f.mon.drain()
	type ack struct {
		at  time.Time
		err error
	}
	acks := make(chan ack, 1)
	go func() {
		err := deleteTable(int(f.ns))
		acks <- ack{time.Now(), err}
	}()
	deleted, ok := f.mon.waitForeign(ctx, trialTimeout)
	if !ok {
		<-acks
		return 0, errors.New("the monitor did not see the floor table's deletion")
	}
	_, serr := f.k.Send(p, 0)
	a := <-acks
	if err := errors.Join(a.err, serr); err != nil {
		return 0, err
	}
	f.cur = i
	if a.at.Before(deleted) {
		deleted = a.at
	}
	created, ok := f.mon.waitForeign(ctx, trialTimeout)
	if !ok {
		return 0, errors.New("the monitor did not see the floor table's creation")
	}
	return created.Sub(deleted), nil
}

// conntrackDump is the CPU time of the thread that runs the agent's
// conntrack cleanup in the namespace ns with deciders that agree (no
// entry is stale): the local addresses read, the dump, nothing deleted.
// The harness runs in another namespace than ns, so it includes a few
// setns calls that the agent, in its own, does not make.
func conntrackDump(ns netns.NsHandle) (time.Duration, error) {
	same := func(conntrack.Flow) (bool, bool) { return false, true }
	return onThread(func() error {
		_, err := conntrack.CleanupMarked(ns, conntrack.ModeUDP, same, same, -1)
		return err
	})
}

// onThread runs f with its goroutine locked to one thread and returns
// the CPU time that thread used meanwhile.
func onThread(f func() error) (time.Duration, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	c0, err := threadCPU()
	if err != nil {
		return 0, err
	}
	ferr := f()
	c1, cerr := threadCPU()
	return c1 - c0, errors.Join(ferr, cerr)
}

// threadCPU is the CPU time the calling thread has used, user and
// system (CLOCK_THREAD_CPUTIME_ID: brought up to date at the call, where
// /proc's schedstat of a running thread moves only at a tick or a
// switch); the caller locks its goroutine to the thread.
func threadCPU() (time.Duration, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0, fmt.Errorf("the thread's CPU time: %w", err)
	}
	return time.Duration(ts.Nano()), nil
}

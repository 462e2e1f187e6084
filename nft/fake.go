package nft

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Fake is an in-memory Kernel: it holds a table, counts generations,
// refuses stale plans and runs plans with Exec, all or nothing. Tests
// change its table behind the agent's back with Tamper.
type Fake struct {
	NoOwner bool
	// OwnerRefusal, if set, is the error with which the fake kernel
	// refuses the creation of an owned table, as a kernel before 6.9 does
	// (6.1: EOPNOTSUPP, 5.10: EINVAL). As Netlink does, the fake then
	// stops owning (Owns reports false) and Send answers ErrStale.
	OwnerRefusal error
	// Refuse, if set, is asked about every operation of every plan; an
	// error refuses the whole transaction, as the kernel would.
	Refuse func(Op) error
	// ReadErr and SendErr, if set, fail every Read or Send.
	ReadErr, SendErr error

	mu          sync.Mutex
	unsupported bool // OwnerRefusal was answered
	table       *Table
	gen         uint32
	sent        []Plan
	events      chan Event
}

func (f *Fake) Owns() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.NoOwner && !f.unsupported
}

// Read returns a copy of the table and the generation.
func (f *Fake) Read() (*Table, uint32, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ReadErr != nil {
		return nil, 0, f.ReadErr
	}
	return f.table.Clone(), f.gen + 1, nil
}

// Send runs the plan as one transaction.
func (f *Fake) Send(p Plan, gen uint32) (Sent, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.SendErr != nil {
		return Sent{}, f.SendErr
	}
	if gen != 0 && gen != f.gen+1 {
		return Sent{}, ErrStale
	}
	if f.table != nil && f.table.Owner == OwnedByOther {
		return Sent{}, errors.New("operation not permitted")
	}
	for _, op := range p.Ops {
		var err error
		if f.OwnerRefusal != nil && op.Kind == KindTable && op.Verb == Add && op.Owned {
			err = f.OwnerRefusal
		} else if f.Refuse != nil {
			err = f.Refuse(op)
		}
		switch {
		case err != nil && RefusesOwnership(op, err):
			// What Netlink concludes from the same refusal.
			f.unsupported = true
			return Sent{}, CannotOwn(fmt.Errorf("%s: %w", op, err))
		case err != nil:
			return Sent{}, err
		}
	}
	t, err := ExecPlan(f.table, p)
	if err != nil {
		return Sent{}, err
	}
	f.table = t
	f.gen++
	f.sent = append(f.sent, p)
	return Sent{Messages: len(p.Ops)}, nil
}

// Tamper changes the table as another process would (a new generation),
// and notifies a running Watch.
func (f *Fake) Tamper(what string, change func(t **Table)) {
	f.mu.Lock()
	change(&f.table)
	f.gen++
	ch := f.events
	f.mu.Unlock()
	if ch != nil {
		ch <- Event{What: what}
	}
}

// Table returns a copy of what the fake kernel holds.
func (f *Fake) Table() *Table {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.table.Clone()
}

// Sent returns the plans sent so far.
func (f *Fake) Sent() []Plan {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Plan(nil), f.sent...)
}

// Watch delivers Tamper's and Lose's events until ctx is done.
func (f *Fake) Watch(ctx context.Context, notify func(Event)) error {
	ch := make(chan Event, 64)
	f.mu.Lock()
	f.events = ch
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.events = nil
		f.mu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e := <-ch:
			notify(e)
		}
	}
}

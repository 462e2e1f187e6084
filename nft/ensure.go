package nft

import (
	"errors"
	"fmt"
	"time"
)

// Kernel is what the agent needs of the kernel's nftables: Netlink is the
// real one, Fake an in-memory one for tests.
type Kernel interface {
	// Read returns the kernel's table inet ip-masq-agent (nil: there is
	// none) and the generation to guard a plan made from it with (0: no
	// guard needed). ErrStale: another process changed the table while
	// it was read; read again.
	Read() (*Table, uint32, error)
	// Send applies a plan as one transaction. With gen not 0, it fails
	// with ErrStale if any transaction committed since generation gen.
	Send(p Plan, gen uint32) (Sent, error)
	// Owns reports whether the table is to be owned by this kernel
	// connection (ownership wanted and supported).
	Owns() bool
}

// ErrStale means the plan was made from a state that is gone: read again
// and plan again.
var ErrStale = errors.New("the ruleset changed since it was read")

// Event is a notification that the table may have changed: a transaction
// of another process that touched it, or a loss of notifications after
// which anything may have happened. It says nothing about who: the
// receiver reads the table back and compares.
type Event struct {
	What string // e.g. "delete table, add rule"; or why notifications were lost
	Lost bool   // notifications were lost (receive buffer overrun, generation gap)
}

// ErrNoAnswer: the kernel did not answer in time; the socket is out of step.
var ErrNoAnswer = errors.New("no answer from the kernel")

// Sent says what a transaction carried.
type Sent struct{ Messages, Bytes int }

// Result says what an Ensure found and did.
type Result struct {
	Unchanged bool   // the kernel held the table already: nothing was sent
	Created   bool   // there was no table
	Recreated bool   // the table was deleted and re-created in one transaction
	Partial   bool   // the table was changed in place
	Found     *Table // what the kernel held before
	Plan      Plan   // the last plan sent
	Attempts  int    // transactions the kernel took or refused, stale ones aside
	Stale     int    // reads and plans tried again because the ruleset moved
	Messages  int    // netlink messages sent, all attempts together
	Bytes     int
	// Undone counts the transactions that the kernel took but that the
	// read back found undone, in part or whole, and that were therefore
	// followed by another: another process changed the table between our
	// commit and the read that verifies it (a repair within the apply).
	Undone int
}

// MaxAttempts bounds the transactions of Ensure after which the table
// still differs, and the tries of Delete.
const MaxAttempts = 5

// Patience bounds how long Ensure tries again after stale reads and
// plans (ErrStale): on a busy node other processes commit every second or
// faster, and a plan guarded by a generation is refused by any of them.
// The retries back off from 1 ms to 250 ms.
var Patience = 30 * time.Second

// Backoff returns the wait before the n-th retry after a stale read or plan.
func Backoff(n int) time.Duration {
	if n <= 1 {
		return 0
	}
	return min(time.Millisecond<<min(n-2, 8), 250*time.Millisecond)
}

// Ensure makes the kernel hold want, and knows that it does: it reads the
// table back, compares, and when they differ sends the plan from what it
// read to want as one transaction (refused by the kernel if anything
// changed since the read), then reads back again to verify. An in-place
// plan that the kernel refuses is followed, in the same Ensure, by one that
// deletes and re-creates the table in one transaction. A table the kernel
// holds already is left alone: nothing is sent, counters keep counting.
func Ensure(k Kernel, want Table) (Result, error) {
	return EnsureBy(k, want, time.Now().Add(Patience))
}

// EnsureBy is Ensure that tries again after stale reads and plans until
// deadline (the agent's next resync).
func EnsureBy(k Kernel, want Table, deadline time.Time) (Result, error) {
	var res Result
	var refused error // why the last in-place plan was refused
	stale := 0        // stale reads and plans in a row
	read := false     // res.Found is set
	taken := false    // the kernel took the last transaction
	retry := func(err error) error {
		stale++
		res.Stale++
		if time.Now().Add(Backoff(stale)).After(deadline) {
			return fmt.Errorf("gave up after %d stale reads or plans: %w", res.Stale, err)
		}
		time.Sleep(Backoff(stale))
		return nil
	}
	for attempt := 1; ; attempt++ {
		want.Owner, want.Persist = NotOwned, false
		if k.Owns() {
			want.Owner, want.Persist = OwnedByUs, true
		}
		found, gen, err := k.Read()
		if errors.Is(err, ErrStale) {
			if err := retry(err); err != nil {
				return res, err
			}
			attempt--
			continue
		}
		if err != nil {
			return res, err
		}
		if !read {
			res.Found, read = found, true
		}
		if found != nil && want.Equal(*found) {
			res.Unchanged = res.Attempts == 0
			return res, nil
		}
		if taken {
			res.Undone++
			taken = false
		}
		if attempt > MaxAttempts {
			rival := ""
			if res.Undone > 0 {
				rival = fmt.Sprintf("; another process changed it back after %d of them", res.Undone)
			}
			return res, fmt.Errorf("table inet %s still differs from the wanted one after %d transactions (%s)%s",
				TableName, res.Attempts, summary(found, want), rival)
		}
		var p Plan
		if refused != nil {
			p = Recreate(found, want, "the kernel refused to change the table in place: "+refused.Error())
		} else if p, err = PlanFor(found, want); err != nil {
			return res, err
		}
		sent, err := k.Send(p, gen)
		res.Attempts++
		res.Messages += sent.Messages
		res.Bytes += sent.Bytes
		switch {
		case errors.Is(err, ErrStale):
			res.Attempts--
			if err := retry(err); err != nil {
				return res, err
			}
			attempt--
			continue
		case err != nil && !p.Recreate && found != nil && !errors.Is(err, ErrNoAnswer) && refused == nil:
			refused = err
			continue
		case err != nil:
			if refused != nil {
				err = fmt.Errorf("%w (and before, in place: %w)", err, refused)
			}
			return res, fmt.Errorf("apply table inet %s: %w", TableName, err)
		}
		res.Plan, taken = p, true
		res.Created, res.Recreated, res.Partial = found == nil, p.Recreate, found != nil && !p.Recreate
		// Loop: read back and compare.
	}
}

// summary says in a few words how found differs from want.
func summary(found *Table, want Table) string {
	if found == nil {
		return "no table"
	}
	p, err := PlanFor(found, want)
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("%d operations would remain, the first: %s", len(p.Ops), p.Ops[0])
}

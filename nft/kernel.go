package nft

import (
	"errors"
	"fmt"
)

// Kernel is what the agent needs of the kernel's nftables: Netlink is the
// real one, Fake an in-memory one for tests.
type Kernel interface {
	// Read returns the kernel's table inet ip-masq-agent (nil: there is
	// none) and the generation it was read at.
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
	Attempts  int    // transactions tried (a stale plan is tried again)
	Messages  int    // netlink messages sent, all attempts together
	Bytes     int
}

// maxAttempts bounds the tries of Ensure and Delete when the ruleset keeps
// changing under them.
const maxAttempts = 5

// Ensure makes the kernel hold want, and knows that it does: it reads the
// table back, compares, and when they differ sends the plan from what it
// read to want as one transaction (refused by the kernel if anything
// changed since the read), then reads back again to verify. An in-place
// plan that the kernel refuses is followed, in the same Ensure, by one that
// deletes and re-creates the table in one transaction. A table the kernel
// holds already is left alone: nothing is sent, counters keep counting.
func Ensure(k Kernel, want Table) (Result, error) {
	var res Result
	var refused error // why the last in-place plan was refused
	for attempt := 1; ; attempt++ {
		want.Owner, want.Persist = NotOwned, false
		if k.Owns() {
			want.Owner, want.Persist = OwnedByUs, true
		}
		found, gen, err := k.Read()
		if err != nil {
			return res, err
		}
		if attempt == 1 {
			res.Found = found
		}
		if found != nil && want.Equal(*found) {
			res.Unchanged = res.Attempts == 0
			return res, nil
		}
		if attempt > maxAttempts {
			return res, fmt.Errorf("table inet %s still differs from the wanted one after %d transactions (%s)",
				TableName, res.Attempts, summary(found, want))
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
			continue
		case err != nil && !p.Recreate && found != nil && !errors.Is(err, errNoAnswer) && refused == nil:
			refused = err
			continue
		case err != nil:
			if refused != nil {
				err = fmt.Errorf("%w (and before, in place: %w)", err, refused)
			}
			return res, fmt.Errorf("apply table inet %s: %w", TableName, err)
		}
		res.Plan = p
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

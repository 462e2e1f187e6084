package kernel

import (
	"errors"
	"fmt"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// Release hands the table this socket owns back as an ordinary table: in
// one transaction it deletes it and creates the same content with no
// owner and no persist flag, so that after the agent exits the table is
// neither owned nor orphaned. nft 1.0.6 lists an orphaned table with a
// bare "flags " line that nft -f refuses, which breaks whole-ruleset saves
// (nft list ruleset > file); an ordinary table lists and loads as any
// other. The next agent re-creates it owned, again in one transaction, so
// the rules are in force throughout. An orphaned table (not owned, still
// persistent: its owner exited without releasing it), which a Netlink
// that does not own (--once) leaves as it finds it, is released alike.
// Nothing is done when the table is owned by another socket or is an
// ordinary one; a table that holds what the agent did not make is left as
// it is (its content could not be re-created exactly).
func (n *Netlink) Release() (released bool, err error) {
	for attempt := 1; ; attempt++ {
		found, gen, err := n.Read()
		if err != nil || found == nil || (found.Owner != nft.OwnedByUs && (found.Owner != nft.NotOwned || !found.Persist)) {
			return false, err
		}
		if odd := foreignContent(found); odd != "" {
			return false, fmt.Errorf("table inet %s not released: it holds %s, which the agent did not make", nft.TableName, odd)
		}
		want := *found.Clone()
		want.Owner, want.Persist = nft.NotOwned, false
		_, err = n.Send(nft.Recreate(found, want, "released at exit"), gen)
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, nft.ErrStale) && attempt < nft.MaxAttempts:
			continue
		}
		return false, fmt.Errorf("release table inet %s: %w", nft.TableName, err)
	}
}

// foreignContent names what a table read from the kernel holds that the
// agent does not make ("" when nothing).
func foreignContent(t *nft.Table) string {
	switch {
	case len(t.Objects) > 0:
		return t.Objects[0].String()
	case t.Dormant:
		return "the dormant flag"
	}
	for _, s := range t.Sets {
		if s.Odd != "" {
			return "set " + s.Name + ": " + s.Odd
		}
	}
	for _, c := range t.Chains {
		if c.Odd != "" {
			return "chain " + c.Name + ": " + c.Odd
		}
		for _, r := range c.Rules {
			if r.Foreign != "" {
				return "a rule in chain " + c.Name + " not encoded as the agent encodes it"
			}
		}
	}
	return ""
}

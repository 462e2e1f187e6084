package kernel

import (
	"errors"
	"fmt"
	"os"

	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// Session is the Netlink's sockets, held for work on tables other than
// the agent's: original/ reads and removes the original agent's
// iptables-nft rules through it. No sync runs while a session does.
type Session struct{ n *Netlink }

// Session runs f with the sockets held.
func (n *Netlink) Session(f func(s Session) error) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return f(Session{n})
}

// NetNS is the namespace the Netlink programs (0: the caller's own).
func (s Session) NetNS() int { return s.n.NetNS }

// Generation returns the ruleset's generation.
func (s Session) Generation() (uint32, error) {
	conn, err := s.n.reader()
	if err != nil {
		return 0, err
	}
	gen, err := generation(conn)
	if err != nil {
		s.n.brokenReader()
		return 0, fmt.Errorf("read the nftables generation: %w", err)
	}
	return gen, nil
}

// Chain returns the handle of chain in table of family (found false: no
// such table or chain).
func (s Session) Chain(family uint8, table, chain string) (handle uint64, found bool, err error) {
	conn, err := s.n.reader()
	if err != nil {
		return 0, false, err
	}
	msgs, err := get(unix.NFT_MSG_GETCHAIN,
		attr(unix.NFTA_CHAIN_TABLE, cstring(table)), attr(unix.NFTA_CHAIN_NAME, cstring(chain))).of(family).ask(conn)
	switch {
	case errors.Is(err, unix.ENOENT) || errors.Is(err, os.ErrNotExist):
		return 0, false, nil
	case err != nil:
		s.n.brokenReader()
		return 0, false, fmt.Errorf("get chain %s: %w", chain, err)
	}
	for _, m := range msgs {
		found = true
		if err := decode(m.Data, func(ad *netlink.AttributeDecoder) {
			if ad.Type() == unix.NFTA_CHAIN_HANDLE {
				handle = ad.Uint64()
			}
		}); err != nil {
			return 0, false, err
		}
	}
	return handle, found, nil
}

// RawRule is a rule of another table as the kernel lists it.
type RawRule struct {
	Handle   uint64
	Exprs    []expr.Any // as google/nftables decodes them
	UserData []byte
}

// Rules lists chain of table of family; no table or chain is no rules.
func (s Session) Rules(family uint8, table, chain string) ([]RawRule, error) {
	conn, err := s.n.reader()
	if err != nil {
		return nil, err
	}
	msgs, err := dump(unix.NFT_MSG_GETRULE,
		attr(unix.NFTA_RULE_TABLE, cstring(table)), attr(unix.NFTA_RULE_CHAIN, cstring(chain))).of(family).ask(conn)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		s.n.brokenReader()
		return nil, err
	}
	var out []RawRule
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		d, err := decodeRuleAttrs(m.Data[4:], family)
		if err != nil {
			return nil, err
		}
		if d.chain == chain {
			out = append(out, RawRule{Handle: d.handle, Exprs: d.exprs, UserData: d.userData})
		}
	}
	return out, nil
}

// Deletion is a rule of another table to delete, by handle; Handle 0
// deletes every rule of the chain, then the chain.
type Deletion struct {
	Family       uint8
	Table, Chain string
	Handle       uint64
}

// Delete commits the deletions as one transaction, refused (ERESTART) if
// any transaction committed since generation gen.
func (s Session) Delete(gen uint32, ds []Deletion) error {
	conn, err := s.n.socket()
	if err != nil {
		return err
	}
	var msgs []netlink.Message
	msg := func(family uint8, typ int, attrs ...netlink.Attribute) {
		msgs = append(msgs, message(family, typ, netlink.Request, attrs...))
	}
	for _, d := range ds {
		where := []netlink.Attribute{attr(unix.NFTA_RULE_TABLE, cstring(d.Table)), attr(unix.NFTA_RULE_CHAIN, cstring(d.Chain))}
		if d.Handle != 0 {
			msg(d.Family, unix.NFT_MSG_DELRULE, append(where, attr(unix.NFTA_RULE_HANDLE, binaryutil.BigEndian.PutUint64(d.Handle)))...)
			continue
		}
		msg(d.Family, unix.NFT_MSG_DELRULE, where...)
		msg(d.Family, unix.NFT_MSG_DELCHAIN, attr(unix.NFTA_CHAIN_TABLE, cstring(d.Table)), attr(unix.NFTA_CHAIN_NAME, cstring(d.Chain)))
	}
	_, err = (&batch{msgs: msgs}).send(conn, gen)
	if errors.Is(err, nft.ErrNoAnswer) {
		s.n.broken()
	}
	return err
}

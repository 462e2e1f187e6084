package original

// The original ip-masq-agent's rules, as iptables-nft writes them: found,
// described and removed over the agent's own netlink socket.
//
// The original agent (kubernetes-sigs/ip-masq-agent, cmd/ip-masq-agent)
// keeps, in iptables' nat table and, with --enable-ipv6, in ip6tables' nat
// table:
//
//	-A POSTROUTING -m comment --comment "ip-masq-agent: ensure nat POSTROUTING directs all non-LOCAL destination traffic to our custom IP-MASQ-AGENT chain" -m addrtype ! --dst-type LOCAL -j IP-MASQ-AGENT
//	:IP-MASQ-AGENT                  (--masq-chain), rewritten whole by iptables-restore --noflush at every resync:
//	-A IP-MASQ-AGENT -m comment --comment "ip-masq-agent: local traffic is not subject to MASQUERADE" -d CIDR -j RETURN ...
//	-A IP-MASQ-AGENT -m comment --comment "ip-masq-agent: outbound traffic is subject to MASQUERADE (must be last in chain)" -j MASQUERADE [--random-fully]
//
// and never removes them. iptables-nft turns them into table ip nat (ip6
// nat) with xtables "match" expressions for the comment and addrtype
// matches and a "target" expression for MASQUERADE. Each rewrite of the
// chain re-adds its rules, with new handles: the handles are the
// fingerprint that tells a running original agent from a gone one.
//
// The chain's name is whatever --masq-chain said (IP-MASQ-AGENT by default,
// IP-MASQ in the Kubernetes addon manifest and on GKE, anything else
// elsewhere), so the rules are found by what they are, not by a name: the
// rules of nat POSTROUTING that carry the jump's comment (the original's
// releases v2.10.0 to v2.12.1 and Azure's ip-masq-agent-v2 write it with
// the double quotes of their format in it) and the chains they jump to;
// and chains called IP-MASQ-AGENT or IP-MASQ, or by the name asked for,
// reported whatever they hold but removed by the daemon only when they are
// the original's (a commented jump, or every rule with its comments).

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft/kernel"

	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/google/nftables/xt"
	"golang.org/x/sys/unix"
)

const (
	// natTable and postrouting are iptables' names.
	natTable    = "nat"
	postrouting = "POSTROUTING"
	// originalJumpCommentFormat is the comment of the original's jump,
	// with its chain's name (ip-masq-agent.go, postRoutingMasqChainCommentFormat).
	originalJumpCommentFormat = "ip-masq-agent: ensure nat POSTROUTING directs all non-LOCAL destination traffic to our custom %s chain"
	// originalJumpCommentPrefix: the comment's fixed part, whatever chain
	// it names.
	originalJumpCommentPrefix = "ip-masq-agent: ensure nat POSTROUTING directs all non-LOCAL destination traffic to our custom"
	// originalCommentPrefix begins the comment of each of the original's rules.
	originalCommentPrefix = "ip-masq-agent: "
	// AddonChain is the chain name of the Kubernetes addon manifest and of
	// GKE (--masq-chain=IP-MASQ).
	AddonChain = "IP-MASQ"
)

// wellKnownChains are looked for by name too: a chain of the original's
// left without its jump carries no jump comment to be found by.
var wellKnownChains = []string{nft.DefaultChain, AddonChain}

// isOriginalJumpComment reports whether c is the comment of the original's
// POSTROUTING jump (Azure's agent and the original's v2.10.0-v2.12.1 keep
// the double quotes of their format in the comment), and the chain it names.
func isOriginalJumpComment(c string) (chain string, ok bool) {
	c = strings.TrimSuffix(strings.TrimPrefix(c, `"`), `"`)
	rest, ok := strings.CutPrefix(c, originalJumpCommentPrefix+" ")
	if !ok {
		return "", false
	}
	name, ok := strings.CutSuffix(rest, " chain")
	return name, ok && name != ""
}

// JumpComment is the comment the original agent gives its
// POSTROUTING jump to chain.
func JumpComment(chain string) string { return fmt.Sprintf(originalJumpCommentFormat, chain) }

// XTRule is a rule of an iptables-nft table.
type XTRule struct {
	Handle  uint64
	Comment string // the comment match's text (or the rule's nft comment)
	Verdict string // accept, return, drop, jump CHAIN, goto CHAIN, masquerade, "" (none), or -j TARGET
	Text    string // the rule in nft's syntax, xtables matches in iptables' (-m comment --comment "...")

	exprs  []expr.Any
	target string // the chain it jumps or goes to
}

func (r XTRule) String() string { return fmt.Sprintf("%s # handle %d", r.Text, r.Handle) }

// Family is what one family's nat table holds of one chain of the
// original agent's: the chain and the jumps to it. A family's nat table
// may hold several (an original run twice with different --masq-chain);
// a family with none has one entry that is not Present, for its
// exemptions.
type Family struct {
	Family       nft.Family // 4: table ip nat (iptables), 6: table ip6 nat (ip6tables)
	Chain        string     // the chain's name: the original's --masq-chain
	ChainPresent bool
	ChainHandle  uint64
	Jumps        []XTRule // the rules of nat POSTROUTING that jump to (or goto) Chain
	Rules        []XTRule // Chain's rules, in order
	// Exemptions are the rules of nat POSTROUTING before the first jump
	// to any of the original's chains (all of them when there is none)
	// whose verdict is accept or return: under the original agent they
	// kept traffic from being masqueraded, which this agent's table (at
	// srcnat + 10) does not see. Only the family's first entry has them.
	Exemptions []XTRule
	// CommentChain is the chain named in the jump's comment, when a jump
	// carries it ("" otherwise): the original's --masq-chain when its jump
	// was written (it differs from Chain only after a hand edit).
	CommentChain string

	first int // the index in nat POSTROUTING of the first jump; -1: none
}

// Present reports whether the family holds the chain or a jump to it.
func (f Family) Present() bool { return f.ChainPresent || len(f.Jumps) > 0 }

// Table names the family's nat table in nft's terms.
func (f Family) Table() string {
	if f.Family == 6 {
		return "ip6 nat"
	}
	return "ip nat"
}

// MetricFamily is "ipv4" or "ipv6".
func (f Family) MetricFamily() string {
	if f.Family == 6 {
		return "ipv6"
	}
	return "ipv4"
}

// Recognised reports whether what was found is the original agent's: a
// jump with its comment, or a chain whose every rule has one of its
// comments. Anything else under the chain's name is reported, never
// removed by the daemon.
func (f Family) Recognised() bool {
	for _, j := range f.Jumps {
		if _, ok := isOriginalJumpComment(j.Comment); ok {
			return true
		}
	}
	if len(f.Rules) == 0 {
		return false
	}
	for _, r := range f.Rules {
		if !strings.HasPrefix(r.Comment, originalCommentPrefix) {
			return false
		}
	}
	return true
}

// Summary is one line: where the chain and the jump are.
func (f Family) Summary() string {
	var w []string
	if f.ChainPresent {
		w = append(w, fmt.Sprintf("chain %s (%d rules)", f.Chain, len(f.Rules)))
	} else {
		w = append(w, fmt.Sprintf("no chain %s", f.Chain))
	}
	switch len(f.Jumps) {
	case 0:
		w = append(w, "no jump from POSTROUTING")
	default:
		for _, j := range f.Jumps {
			w = append(w, fmt.Sprintf("POSTROUTING rule (handle %d): %s", j.Handle, j.Text))
		}
	}
	return "table " + f.Table() + ": " + strings.Join(w, "; ")
}

// Rules is what the node's iptables-nft nat tables hold of the original
// agent's rules, and whether legacy iptables nat tables exist.
type Rules struct {
	// Chain is the name asked for ("": none): a chain of that name is
	// removable whatever it holds (cleanup-iptables --masq-chain NAME).
	Chain    string
	Families []Family // IPv4's entries, then IPv6's; at least one each
	// Legacy names the tools ("iptables", "ip6tables") whose legacy
	// (x_tables) nat table exists in the network namespace: rules there
	// cannot be seen over nftables netlink.
	Legacy []string
	// Gen is the nftables generation this was read at.
	Gen uint32
}

// Present reports whether any family holds the chain or a jump to it.
func (o Rules) Present() bool {
	for _, f := range o.Families {
		if f.Present() {
			return true
		}
	}
	return false
}

// Removes reports whether the family (4 or 6) holds removable chains or
// jumps: the original agent's.
func (o Rules) Removes(family nft.Family) bool {
	for _, f := range o.Families {
		if f.Family == family && o.Removable(f) {
			return true
		}
	}
	return false
}

// Jumped returns the family's (4 or 6) entries that nat POSTROUTING jumps
// to, in the order of their first jump.
func (o Rules) Jumped(family nft.Family) []*Family {
	var out []*Family
	for i := range o.Families {
		if o.Families[i].Family == family && len(o.Families[i].Jumps) > 0 {
			out = append(out, &o.Families[i])
		}
	}
	slices.SortStableFunc(out, func(a, b *Family) int { return a.first - b.first })
	return out
}

// Removable reports whether the entry may be removed: it is the original
// agent's (Recognised), or it is the chain asked for by name.
func (o Rules) Removable(f Family) bool {
	return f.Present() && (f.Recognised() || (o.Chain != "" && f.Chain == o.Chain))
}

// Foreign returns the entries present that are not removable: chains of
// the original's names that hold something else.
func (o Rules) Foreign() []Family {
	var out []Family
	for _, f := range o.Families {
		if f.Present() && !o.Removable(f) {
			out = append(out, f)
		}
	}
	return out
}

// Chains lists the names of the chains found, once each, in order.
func (o Rules) Chains() []string {
	var out []string
	for _, f := range o.Families {
		if f.Present() && !slices.Contains(out, f.Chain) {
			out = append(out, f.Chain)
		}
	}
	return out
}

// RemovableChains lists the names of the removable chains found (the
// original agent's), once each, in order.
func (o Rules) RemovableChains() []string {
	var out []string
	for _, f := range o.Families {
		if o.Removable(f) && !slices.Contains(out, f.Chain) {
			out = append(out, f.Chain)
		}
	}
	return out
}

// Fingerprint changes whenever the original agent rewrites one of its
// removable chains (the rewritten rules get new handles) or a jump.
func (o Rules) Fingerprint() string {
	var b strings.Builder
	for _, f := range o.Families {
		if !o.Removable(f) {
			continue
		}
		b.WriteString(f.Chain + "@")
		fmt.Fprintf(&b, "%d:%d:", f.Family, f.ChainHandle)
		for _, r := range f.Jumps {
			fmt.Fprintf(&b, "j%d,", r.Handle)
		}
		for _, r := range f.Rules {
			fmt.Fprintf(&b, "%d,", r.Handle)
		}
		b.WriteString(";")
	}
	return b.String()
}

// LegacyCommands are the commands that remove the original's rules from a
// legacy nat table (iptables-legacy), which this agent cannot see.
func LegacyCommands(chain, tool string) []string {
	t := tool + "-legacy"
	return []string{
		fmt.Sprintf(`%s -t nat -D POSTROUTING -m comment --comment "%s" -m addrtype ! --dst-type LOCAL -j %s`, t, JumpComment(chain), chain),
		fmt.Sprintf("%s -t nat -F %s", t, chain),
		fmt.Sprintf("%s -t nat -X %s", t, chain),
	}
}

// ErrChanged: the original's rules changed since they were found
// (the original agent still runs): nothing was removed.
var ErrChanged = errors.New("the original agent's rules changed since they were read (is it still running?)")

// Netlink finds and removes the original's rules on the sockets of the
// agent's kernel.Netlink (Fake is the in-memory one).
type Netlink struct{ K *kernel.Netlink }

// FindOriginal reads the iptables-nft nat tables (ip and ip6) for the
// original agent's chains, whatever their names, their jumps and the
// exemptions before them, as one consistent read (the generation did not
// move while reading), and looks for legacy nat tables. chain, if not
// empty, is also looked for by name, and is removable whatever it holds.
func (n Netlink) FindOriginal(chain string) (o Rules, err error) {
	err = n.K.Session(func(s kernel.Session) error {
		if o, err = find(s, chain); err != nil {
			return err
		}
		o.Legacy = legacyNat(s.NetNS())
		return nil
	})
	return o, err
}

// find reads the original's rules in a session.
func find(s kernel.Session, chain string) (Rules, error) {
	for attempt := 1; ; attempt++ {
		before, err := s.Generation()
		if err != nil {
			return Rules{}, err
		}
		o := Rules{Chain: chain, Gen: before}
		for _, fam := range []nft.Family{4, 6} {
			fs, err := readOriginalFamily(s, fam, chain)
			if err != nil {
				return Rules{}, fmt.Errorf("read table %s: %w", Family{Family: fam}.Table(), err)
			}
			o.Families = append(o.Families, fs...)
		}
		after, err := s.Generation()
		if err != nil {
			return Rules{}, err
		}
		if before == after {
			return o, nil
		}
		if attempt == nft.MaxAttempts {
			return Rules{}, fmt.Errorf("read the iptables nat tables: the ruleset kept changing while it was read (%d tries)", attempt)
		}
	}
}

// readOriginalFamily reads one family's nat table: nat POSTROUTING, then
// each candidate chain (the targets of the jumps that carry the
// original's comment, the chains those comments name, the well-known
// names and chain). It returns an entry per chain present or jumped to;
// at least one, which holds the exemptions.
func readOriginalFamily(s kernel.Session, fam nft.Family, chain string) ([]Family, error) {
	proto := nft.NFProto(fam)
	post, err := readXTRules(s, proto, postrouting)
	if err != nil {
		return nil, fmt.Errorf("list chain %s: %w", postrouting, err)
	}
	var candidates []string
	add := func(c string) {
		if c != "" && c != postrouting && !slices.Contains(candidates, c) {
			candidates = append(candidates, c)
		}
	}
	for _, r := range post {
		if named, ok := isOriginalJumpComment(r.Comment); ok {
			add(r.target)
			add(named)
		}
	}
	add(chain)
	for _, c := range wellKnownChains {
		add(c)
	}
	var out []Family
	for _, c := range candidates {
		f := Family{Family: fam, Chain: c}
		if err := readOriginalChain(s, proto, &f); err != nil {
			return nil, err
		}
		if f.Present() {
			out = append(out, f)
		}
	}
	// The other chains POSTROUTING jumps to: an accept there is an
	// exemption too (withJumps).
	subs := map[string][]XTRule{}
	for _, r := range post {
		t := r.target
		if _, read := subs[t]; read || t == "" || t == postrouting || slices.Contains(candidates, t) || nft.RuleVerdict(r.exprs) != "jump "+t {
			continue
		}
		rs, err := readXTRules(s, proto, t)
		if err != nil {
			return nil, fmt.Errorf("list chain %s: %w", t, err)
		}
		subs[t] = rs
	}
	return withJumps(fam, chain, post, out, subs), nil
}

// readOriginalChain reads chain f.Chain of the nat table, if there.
func readOriginalChain(s kernel.Session, proto uint8, f *Family) (err error) {
	if f.ChainHandle, f.ChainPresent, err = s.Chain(proto, natTable, f.Chain); err != nil || !f.ChainPresent {
		return err
	}
	if f.Rules, err = readXTRules(s, proto, f.Chain); err != nil {
		return fmt.Errorf("list chain %s: %w", f.Chain, err)
	}
	return nil
}

// withJumps gives each entry (chains found, present or not) its jumps
// from nat POSTROUTING and drops those with neither chain nor jump; the
// first entry gets the exemptions: the accept and return rules before the
// first jump to any of them. A family with no entry left gets one that
// is not present, named chain (or the default), with the exemptions.
//
// An accept in a chain that a rule before the first jump jumps to (subs:
// the rules of such chains) ends nat POSTROUTING too: it is an exemption,
// the jump's matches and its own.
func withJumps(fam nft.Family, chain string, post []XTRule, found []Family, subs map[string][]XTRule) []Family {
	var out []Family
	firstJump := len(post)
	for _, f := range found {
		f.first = -1
		for i, r := range post {
			if r.target != f.Chain {
				continue
			}
			f.Jumps = append(f.Jumps, r)
			if f.first < 0 {
				f.first = i
			}
			if n, ok := isOriginalJumpComment(r.Comment); ok && f.CommentChain == "" {
				f.CommentChain = n
			}
			firstJump = min(firstJump, i)
		}
		if f.Present() {
			out = append(out, f)
		}
	}
	var exemptions []XTRule
	for _, r := range post[:firstJump] {
		if nft.RulePasses(r.exprs) {
			exemptions = append(exemptions, r)
		}
		if r.target == "" || nft.RuleVerdict(r.exprs) != "jump "+r.target {
			continue
		}
		for _, x := range subs[r.target] {
			if x.Verdict != "accept" {
				continue // a return there returns to POSTROUTING
			}
			var matches []expr.Any
			for _, e := range r.exprs {
				if _, v := e.(*expr.Verdict); !v {
					matches = append(matches, e)
				}
			}
			exemptions = append(exemptions, XTRule{Handle: x.Handle, Comment: x.Comment, Verdict: x.Verdict,
				Text: r.Text + " -> chain " + r.target + ": " + x.Text, exprs: append(matches, x.exprs...)})
		}
	}
	if len(out) == 0 {
		out = append(out, absent(fam, chain))
	}
	out[0].Exemptions = exemptions
	return out
}

// absent is the entry of a family without the original's rules: named
// chain, or the default.
func absent(fam nft.Family, chain string) Family {
	if chain == "" {
		chain = nft.DefaultChain
	}
	return Family{Family: fam, Chain: chain, first: -1}
}

// readXTRules reads a chain of a nat table; no table or chain is no rules.
func readXTRules(s kernel.Session, proto uint8, chain string) ([]XTRule, error) {
	rules, err := s.Rules(proto, natTable, chain)
	if err != nil {
		return nil, err
	}
	var out []XTRule
	for _, r := range rules {
		out = append(out, newXTRule(r.Handle, r.Exprs, r.UserData))
	}
	return out, nil
}

// newXTRule describes a rule read from an iptables-nft table.
func newXTRule(handle uint64, exprs []expr.Any, userData []byte) XTRule {
	r := XTRule{Handle: handle, exprs: exprs}
	for _, e := range exprs {
		if m, ok := e.(*expr.Match); ok && m.Name == "comment" {
			if c, ok := m.Info.(*xt.Comment); ok {
				r.Comment = string(*c)
			}
		}
	}
	r.Verdict, r.target = nft.RuleVerdict(exprs), nft.RuleTarget(exprs)
	r.Text = nft.DescribeExprs(exprs)
	if c, ok := userdata.GetString(userData, userdata.TypeComment); ok && c != "" {
		if r.Comment == "" {
			r.Comment = c
		}
		r.Text += fmt.Sprintf(" comment %q", c)
	}
	return r
}

// RemoveOriginal removes the original agent's rules from the iptables-nft
// nat tables in one transaction: for each removable chain found (the
// original's, whatever its name, and chain if not empty), its jumps from
// POSTROUTING (by handle), then the chain, flushed and deleted, for both
// families; nothing else. With fingerprint not empty, it removes nothing
// and returns ErrChanged if the rules are no longer the ones with
// that fingerprint. The transaction carries the generation of its read, so
// that it is refused if anything changed in between (then it reads and
// tries again). It returns what it removed: Families holds the removed
// entries only (none, when nothing removable was there). With families
// given, only theirs are removed (and fingerprinted); none: both.
func (n Netlink) RemoveOriginal(chain, fingerprint string, families ...nft.Family) (o Rules, err error) {
	err = n.K.Session(func(s kernel.Session) error {
		for attempt := 1; ; attempt++ {
			if o, err = find(s, chain); err != nil {
				return err
			}
			o = o.Of(families...)
			if fingerprint != "" && o.Fingerprint() != fingerprint {
				return ErrChanged
			}
			o = o.removable()
			if !o.Present() {
				return nil
			}
			err = s.Delete(o.Gen, deletions(o))
			switch {
			case err == nil:
				return nil
			case errors.Is(err, unix.ERESTART) && attempt < nft.MaxAttempts:
				continue
			case errors.Is(err, unix.ERESTART):
				return fmt.Errorf("%w: %w", nft.ErrStale, err)
			case errors.Is(err, unix.EBUSY):
				err = fmt.Errorf("%w (chain %s is still referenced by a rule other than POSTROUTING's jumps)", err, chain)
			}
			return fmt.Errorf("remove the original agent's rules: %w", err)
		}
	})
	return o, err
}

// Of is o with the entries of the families given only (none: all).
func (o Rules) Of(families ...nft.Family) Rules {
	if len(families) == 0 {
		return o
	}
	return o.only(func(f Family) bool { return slices.Contains(families, f.Family) })
}

// removable is o with only its removable entries.
func (o Rules) removable() Rules {
	r := o
	r.Families = nil
	for _, f := range o.Families {
		if o.Removable(f) {
			r.Families = append(r.Families, f)
		}
	}
	return r
}

// deletions are the removal: the jumps by handle, then each chain
// flushed and deleted.
func deletions(o Rules) []kernel.Deletion {
	var out []kernel.Deletion
	for _, f := range o.Families {
		proto := nft.NFProto(f.Family)
		for _, j := range f.Jumps {
			out = append(out, kernel.Deletion{Family: proto, Table: natTable, Chain: postrouting, Handle: j.Handle})
		}
		if f.ChainPresent {
			out = append(out, kernel.Deletion{Family: proto, Table: natTable, Chain: f.Chain})
		}
	}
	return out
}

// legacyNat returns the tools whose legacy nat table exists in the
// namespace (/proc/net/ip_tables_names and ip6_tables_names are per
// network namespace).
func legacyNat(netns int) []string {
	var out []string
	read := func() {
		for _, x := range []struct{ file, tool string }{
			{"ip_tables_names", "iptables"}, {"ip6_tables_names", "ip6tables"},
		} {
			data, err := os.ReadFile("/proc/thread-self/net/" + x.file)
			if err != nil {
				continue // no x_tables module loaded: no legacy table
			}
			if slices.Contains(strings.Fields(string(data)), natTable) {
				out = append(out, x.tool)
			}
		}
	}
	if netns == 0 {
		read()
		return out
	}
	// Another namespace (tests): read its /proc/net from a thread in it.
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		if unix.Unshare(unix.CLONE_FS) != nil || unix.Setns(netns, unix.CLONE_NEWNET) != nil {
			return
		}
		read()
	}()
	<-done
	return out
}

// ExplainOriginal says what the original's rules of a's family do to a
// new connection to a, before table inet ip-masq-agent sees it (iptables'
// nat POSTROUTING runs at priority srcnat, the agent's chain at srcnat +
// 10). decided is false when they leave the decision to the agent's table.
// The original's chains are taken in the order of their jumps.
func (o Rules) ExplainOriginal(a netip.Addr, local bool) (e nft.Explanation, decided bool) {
	a = a.Unmap()
	fam := nft.Family(4)
	if a.Is6() {
		fam = 6
	}
	e.Addr = a
	jumped := o.Jumped(fam)
	if len(jumped) == 0 {
		return e, false
	}
	for _, f := range o.Families {
		if f.Family != fam {
			continue
		}
		for _, x := range f.Exemptions {
			switch xtMatch(x, a, local) {
			case nft.MatchYes:
				e.Reason = fmt.Sprintf("nat POSTROUTING rule %q %ss it before the original agent's jump: not masqueraded by iptables; table inet %s decides next", x.Text, x.Verdict, nft.TableName)
				return e, false
			case nft.MatchUnknown:
				e.Undetermined = true
				e.Reason = fmt.Sprintf("nat POSTROUTING rule %q may %s it before the original agent's jump (it matches on more than the destination)", x.Text, x.Verdict)
				e.Rule = x.Text
				return e, true
			}
		}
	}
	var reasons []string
	for _, f := range jumped {
		e, decided := f.explain(e, a, local)
		if decided {
			return e, true
		}
		if e.Reason != "" {
			reasons = append(reasons, e.Reason)
		}
	}
	e.Reason = strings.Join(reasons, "; ")
	return e, false
}

// explain evaluates one of the original's chains, entered by its first
// jump, with nft's evaluator, and says what it found.
func (f *Family) explain(e nft.Explanation, a netip.Addr, local bool) (nft.Explanation, bool) {
	where := fmt.Sprintf("the original ip-masq-agent's rules in table %s (iptables nat POSTROUTING, priority srcnat: before table inet %s)", f.Table(), nft.TableName)
	if !f.Recognised() {
		where = fmt.Sprintf("chain %s in table %s (a name of the original ip-masq-agent's, not its rules: left alone; iptables nat POSTROUTING, priority srcnat: before table inet %s)", f.Chain, f.Table(), nft.TableName)
	}
	j := f.Jumps[0]
	switch xtMatch(j, a, local) {
	case nft.MatchNo:
		return e, false // a local destination: the jump is not taken
	case nft.MatchUnknown:
		e.Undetermined, e.Reason, e.Rule = true, where+" jump for some packets only", j.Text
		return e, true
	}
	rules := make([]nft.Rule, len(f.Rules))
	for i, r := range f.Rules {
		rules[i] = nft.FoundRule(r.exprs, "")
	}
	v := nft.EvalChain(f.Chain, rules, nft.Packet{Dst: a}, local)
	if v.Rule > 0 {
		e.Rule = f.Rules[v.Rule-1].Text
	}
	switch {
	case v.Undetermined:
		e.Undetermined, e.Reason = true, where+": "+v.Why
	case v.Masquerade:
		e.Masquerade, e.Reason = true, fmt.Sprintf("masqueraded by %s: chain %s rule %d", where, f.Chain, v.Rule)
	case v.Passes && v.Rule > 0:
		e.Reason = fmt.Sprintf("not masqueraded by %s (chain %s rule %d returns); table inet %s decides next", where, f.Chain, v.Rule, nft.TableName)
		return e, false
	case v.Passes:
		e.Reason = fmt.Sprintf("no rule of %s matched; table inet %s decides next", where, nft.TableName)
		return e, false
	default: // accept, drop: what iptables then does is not followed here
		e.Undetermined, e.Reason = true, fmt.Sprintf("%s: chain %s rule %d: %s", where, f.Chain, v.Rule, v.Verdict)
	}
	return e, true
}

// xtMatch evaluates an iptables-nft rule's matches on a new connection from
// a pod to a, with ExplainTable's evaluator: destination prefixes, comments
// and the destination's address type are known; anything else (the source,
// interfaces, marks) is not.
func xtMatch(r XTRule, a netip.Addr, local bool) nft.Match {
	return nft.MatchExprs(r.exprs, nft.Packet{Dst: a}, local)
}

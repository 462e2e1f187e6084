// Package nft is pure: it turns a config into the agent's nftables table
// (Build), plans the one transaction that turns the table the kernel
// holds into it (Plan), encodes and decodes rules as nftables expressions
// (codec.go), evaluates them (explain.go), and sends and verifies a plan
// over a Kernel (Ensure): nft/kernel's Netlink for the real one, Fake in
// memory. No socket and no file is opened here (pure_test.go).
//
// Data flows one way: Config -> Table (wanted) -> Plan -> kernel, and back
// once: kernel -> Table (found). The same Table type describes both, so
// "in sync" is a comparison of data.
package nft

import (
	"fmt"
	"net/netip"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/google/nftables/expr"
)

// Names of the kernel objects the agent owns. The agent writes nothing
// outside table inet ip-masq-agent.
const (
	TableName = "ip-masq-agent"

	// BaseChainName is the chain hooked at nat postrouting; it holds only the
	// fib guard and the jump, as the original agent's POSTROUTING rule does.
	BaseChainName = "postrouting"
	// MasqChainName holds the masquerade statement(s), so that --to-ports and
	// --random-fully are spelled out once for every rule that masquerades.
	MasqChainName = "masq-to-node"
	// DefaultChain is the default of --masq-chain, the original agent's chain name.
	DefaultChain = "IP-MASQ-AGENT"

	SetMasqV4    = "masq-v4"
	SetNonMasqV4 = "nonmasq-v4"
	SetMasqV6    = "masq-v6"
	SetNonMasqV6 = "nonmasq-v6"

	// Priority is srcnat + 10: after iptables' nat POSTROUTING (srcnat, where
	// the original agent appended its jump last) and after kube-proxy's
	// nftables srcnat chains, so their masquerade decisions come first, as
	// they did with the original agent. The first NAT chain to masquerade a
	// connection wins; a return here leaves the decision to later chains.
	Priority = 110

	// DefaultConntrackLabel is the default of --conntrack-label: the
	// conntrack label bit the masquerade rules set. kube-proxy, Flannel,
	// kindnet, Calico and Cilium set no conntrack labels (they use packet
	// marks, Calico and Istio also conntrack marks); docs/conntrack.md.
	DefaultConntrackLabel = 20
)

// AgentSet says whether name is one of the agent's sets: a set of one
// of Build's decisions (build.go).
func AgentSet(name string) bool {
	for _, d := range decisions {
		if name == d.sets[0] || name == d.sets[1] {
			return true
		}
	}
	return false
}

// Family is an IP version: 4 or 6; 0 means both.
type Family uint8

// Verdict is what a rule does when it matches.
type Verdict uint8

const (
	Return Verdict = iota + 1
	Jump
	Goto
	Masquerade
)

// Owner says which netlink socket owns a table (NFT_TABLE_F_OWNER): while
// its owner's socket is open, the kernel refuses every change to the table
// from any other socket, root's included.
type Owner uint8

const (
	NotOwned     Owner = iota // anyone with CAP_NET_ADMIN may change it
	OwnedByUs                 // the agent's own socket owns it (and it persists after the agent exits)
	OwnedByOther              // another process's socket owns it: the kernel refuses our changes
)

func (o Owner) String() string {
	return [...]string{"not owned", "owned by this agent", "owned by another process"}[o]
}

// Table is the whole content of table inet ip-masq-agent: what the agent
// wants (from Build) or what the kernel holds (from a Kernel's Read).
type Table struct {
	Owner   Owner
	Persist bool // stays, unowned, when its owner's socket closes (NFT_TABLE_F_PERSIST)
	Dormant bool // found only: the table is switched off (NFT_TABLE_F_DORMANT)

	Sets    []Set
	Chains  []Chain  // Build's order: base, decision, masquerade
	Objects []Object // found only: stateful objects and flowtables, which the agent never makes

	Use uint32 // found only: how many chains, sets, objects and flowtables the kernel counts in it
}

// Set is an interval set of the agent's: of addresses of one family
// (KeyIPv4, KeyIPv6) or of interface names (KeyIfname). Its elements are
// ranges of values of its key: an interface name is its 16 bytes as a
// 128-bit value (IfnamePrefix), so every key shares the model, the plan,
// the batch and the read-back; the key type says how to write them.
type Set struct {
	Name    string
	Key     SetKey // its key type; 0: one the agent does not make (Odd says which)
	Comment string
	// Elements are disjoint, sorted ranges. Build makes the fewest that
	// cover the config's prefixes (adjacent ones merged; explain names
	// the listed prefix behind one).
	Elements []Range
	// Odd says, for a set found in the kernel, what makes it other than
	// the plain interval set the agent makes (a map, a timeout, a size, set
	// or element expressions, ...); such a set is replaced, not refilled.
	Odd string
}

// Chain is a chain with its rules.
type Chain struct {
	Name  string
	Hook  *Hook // nil for a regular chain
	Rules []Rule
	Odd   string // found only: what else the kernel's chain has (devices, flags)
}

// Hook is what makes a chain a base chain.
type Hook struct {
	Type     string // "nat", "filter", "route"
	Hook     string // "postrouting", ...
	Priority int
	Policy   string // "accept" or "drop"
}

// Rule is one rule as a conjunction of optional matches, a counter (always,
// placed before the verdict so that it counts) and a verdict. codec.go
// encodes, decodes and renders each of these fields, side by side (its
// table parts); equal compares them all.
type Rule struct {
	NotLocal    bool       // fib daddr type != local
	Family      Family     // meta nfproto ipv4/ipv6 (implied by a lookup of an address)
	Selector    Selector   // what Set is looked up with (selector.go)
	Set         string     // ip daddr @set, ip6 saddr @set, ...
	OutIf       string     // oifname "OutIf": the snatAddress rule's interface (build.go)
	Invert      bool       // ip saddr != @set: the lookup matches what the set does not hold
	L4Proto     uint8      // meta l4proto
	Share       *Share     // numgen random mod Of < Below
	CtLabel     *uint8     // ct label set BIT: marks the connections the rule masquerades
	Verdict     Verdict    // Return, Jump, Goto or Masquerade
	Target      string     // chain for Jump and Goto
	Ports       *PortRange // masquerade to :First-Last
	FullyRandom bool       // masquerade fully-random
	// To, when valid, makes the masquerade a source NAT to this address
	// (snat ip to To, snat ip6 to To; of the rule's Family): snatAddress.
	// Ports and FullyRandom apply to it as to a masquerade.
	To      netip.Addr
	Comment string

	// Foreign, for a rule found in the kernel that the agent cannot have
	// written, is that rule in a syntax close to nft's; such a rule never
	// equals a wanted one.
	Foreign string
	// Packets and Bytes are a found rule's counter; never compared.
	Packets, Bytes uint64
	exprs          []expr.Any // a found rule's expressions, for ExplainTable
}

// Object is a stateful object (counter, quota, limit, ...) or a flowtable
// found in the agent's table. The agent makes none, so every one found is
// removed.
type Object struct {
	Kind string // "counter", "quota", ..., or "flowtable"
	Type uint32 // NFT_OBJECT_*; 0 for a flowtable
	Name string
}

func (o Object) String() string { return o.Kind + " " + o.Name }

// Share matches a random Below out of Of connections.
type Share struct{ Below, Of uint32 }

// PortRange is an inclusive range of source ports.
type PortRange struct{ First, Last uint16 }

func (p PortRange) size() uint32 { return uint32(p.Last) - uint32(p.First) + 1 }

func (p PortRange) String() string { return fmt.Sprintf("%d-%d", p.First, p.Last) }

// Set returns the set named name, or nil.
func (t *Table) Set(name string) *Set {
	if t == nil {
		return nil
	}
	for i := range t.Sets {
		if t.Sets[i].Name == name {
			return &t.Sets[i]
		}
	}
	return nil
}

// Chain returns the chain named name, or nil.
func (t *Table) Chain(name string) *Chain {
	if t == nil {
		return nil
	}
	for i := range t.Chains {
		if t.Chains[i].Name == name {
			return &t.Chains[i]
		}
	}
	return nil
}

// DecisionChain returns the chain the base chain jumps to (--masq-chain).
func (t *Table) DecisionChain() *Chain {
	for _, c := range t.Chains {
		if c.Hook == nil && c.Name != MasqChainName {
			return t.Chain(c.Name)
		}
	}
	return nil
}

// HasAdjacent reports whether an address set of t holds two ranges that
// touch (Options.MergeAdjacent would join them).
func (t Table) HasAdjacent() bool {
	for _, s := range t.Sets {
		if s.Key == KeyIfname {
			continue
		}
		for i := 1; i < len(s.Elements); i++ {
			if s.Elements[i-1].before(s.Elements[i]) {
				return true
			}
		}
	}
	return false
}

// Equal reports whether the kernel's table found holds exactly what t
// wants: ownership, sets with their elements, chains with their hooks and
// rules in order, and nothing else. Counter values are not compared, nor
// is the order of sets, chains and objects.
func (t Table) Equal(found Table) bool {
	if t.Owner != found.Owner || found.Dormant != t.Dormant || len(found.Objects) != len(t.Objects) ||
		len(t.Sets) != len(found.Sets) || len(t.Chains) != len(found.Chains) {
		return false
	}
	for _, s := range t.Sets {
		if f := found.Set(s.Name); f == nil || !s.equal(*f) {
			return false
		}
	}
	for _, c := range t.Chains {
		if f := found.Chain(c.Name); f == nil || !c.equal(*f) {
			return false
		}
	}
	return true
}

// sameShape reports whether a found set can be refilled in place to be s.
func (s Set) sameShape(found Set) bool {
	return s.Key == found.Key && s.Comment == found.Comment && s.Odd == found.Odd
}

func (s Set) equal(found Set) bool {
	return s.sameShape(found) && slices.Equal(s.Elements, found.Elements)
}

// sameShape reports whether a found chain can be flushed and refilled to be c.
func (c Chain) sameShape(found Chain) bool {
	return ptrEqual(c.Hook, found.Hook) && c.Odd == found.Odd
}

func (c Chain) equal(found Chain) bool {
	return c.sameShape(found) && slices.EqualFunc(c.Rules, found.Rules, Rule.equal)
}

// equal compares every field of two rules but the counter's values and
// the kernel's expressions, so that a new field is compared without
// being named here.
func (r Rule) equal(o Rule) bool {
	r.Packets, r.Bytes, r.exprs = 0, 0, nil
	o.Packets, o.Bytes, o.exprs = 0, 0, nil
	return reflect.DeepEqual(r, o)
}

func ptrEqual[T comparable](a, b *T) bool { return a == b || (a != nil && b != nil && *a == *b) }

// Options are the command-line flags that shape the table.
type Options struct {
	Chain       string      // --masq-chain
	EnableIPv6  bool        // --enable-ipv6
	RandomFully bool        // --random-fully
	ToPorts     []PortRange // --to-ports
	// CtLabel is --conntrack-label: the conntrack label bit that the
	// masquerade rules set on the connections they masquerade, so that
	// the conntrack cleanup knows them from those another component
	// masquerades; nil: none.
	CtLabel *uint8
	// Links returns the names of the node's interfaces that hold an
	// address (the daemon's and the tools' netlink view; nil: none known):
	// snatAddress is used only for packets leaving through one of them
	// (Build). Build calls it once per address.
	Links func(netip.Addr) []string
	// SNAT: the table may source-NAT to an address (the config at start
	// has snatAddress or snatAddressIPv6), so the start probe asks the
	// kernel for snat (kernel.ProbeFor). Build does not read it.
	SNAT bool
	// MergeAdjacent: the kernel's interval sets look up in an array built
	// at each commit (kernel.Netlink.IntervalLookup, from its answer to a
	// get), so a packet sees the set before a transaction or after it,
	// never a start element in between: adjacent ranges of a set are one
	// element (10.0.0.0/24 and 10.0.1.0/24: 10.0.0.0/23). Otherwise each
	// listed CIDR keeps its own start element (paint says why).
	MergeAdjacent bool
}

// MarkLabel returns the conntrack label bit with which the table's
// masquerade chain marks every connection it masquerades, or -1 when a
// masquerade rule of that chain does not mark (or the table has none).
func (t *Table) MarkLabel() int {
	c := t.Chain(MasqChainName)
	if c == nil {
		return -1
	}
	bit := -1
	for _, r := range c.Rules {
		if r.Foreign != "" || r.Verdict != Masquerade || r.CtLabel == nil || (bit >= 0 && int(*r.CtLabel) != bit) {
			return -1
		}
		bit = int(*r.CtLabel)
	}
	return bit
}

// nftNameRE is a name that nft's parser reads back as a chain name
// unquoted (its scanner's {string}): nft has no syntax for a chain named
// otherwise (1MASQ, MASQ:1, a#b, .MASQ), so a saved ruleset holding one
// would not load with nft -f.
var nftNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9/_.-]*$`)

// nftKeywordSafe: nft's keywords are lowercase letters, digits and '-'
// (mark, counter, return, sack-perm ...), in every version; a name with
// an uppercase letter, '_', '.' or '/' is never one.
var nftKeywordSafe = regexp.MustCompile(`[A-Z_./]`)

// maxChainName is the kernel's limit (NFT_CHAIN_MAXNAMELEN, 256 with the NUL).
const maxChainName = 255

// iptablesTargets are names iptables refuses for a new chain ("chain name
// may not clash with target name"): the standard verdicts and the target
// extensions of iptables 1.8; and the nat table's built-in chains, to
// which the original's jump failed.
var iptablesTargets = []string{"ACCEPT", "DROP", "QUEUE", "RETURN", "standard",
	"AUDIT", "CHECKSUM", "CLASSIFY", "CLUSTERIP", "CONNMARK", "CONNSECMARK", "CT", "DNAT", "DNPT", "DSCP",
	"ECN", "HL", "HMARK", "IDLETIMER", "LED", "LOG", "MARK", "MASQUERADE", "NETMAP", "NFLOG", "NFQUEUE",
	"NOTRACK", "RATEEST", "REDIRECT", "REJECT", "SECMARK", "SET", "SNAT", "SNPT", "SYNPROXY", "TCPMSS",
	"TCPOPTSTRIP", "TEE", "TOS", "TPROXY", "TRACE", "TTL", "ULOG"}

var natBuiltins = []string{"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"}

// OriginalCannotWrite says why the original agent could never write its
// chain under --masq-chain name ("" when it could): iptables -N refuses
// names of 29 characters or more, starting with '-' or '!', holding a
// space, or clashing with a target; the jump to a built-in chain fails;
// iptables-restore cannot parse a rule of a chain whose name holds '"'.
// The original then ran and logged the error at every sync, with no
// masquerade rules of its own.
func OriginalCannotWrite(name string) string {
	switch {
	case name == "":
		return "iptables refuses an empty chain name"
	case len(name) >= 29:
		return fmt.Sprintf("iptables refuses chain names of 29 characters or more (this one has %d)", len(name))
	case name[0] == '-' || name[0] == '!':
		return fmt.Sprintf("iptables refuses chain names starting with %q", name[0])
	case strings.ContainsAny(name, " \t\n\v\f\r"):
		return "iptables refuses chain names holding white space"
	case slices.Contains(iptablesTargets, name):
		return "iptables refuses a chain named like a target (\"chain name may not clash with target name\")"
	case slices.Contains(natBuiltins, name):
		return "it is a built-in chain of table nat, to which iptables refused the original's jump"
	case strings.Contains(name, `"`):
		return "iptables-restore refused the original's rules for a chain name holding '\"'"
	}
	return ""
}

// ChainName returns the name of the decision chain in table inet
// ip-masq-agent for --masq-chain flag, and, when it is not flag itself,
// why. The name is flag when nft's parser reads it back unquoted (so a
// saved ruleset loads with nft -f), it is not a keyword of nft, and it is
// none of the agent's other chains; else flag in upper case when that is
// such a name (postrouting: POSTROUTING), else DefaultChain. The name
// decides nothing: the decisions are the same under any name.
func ChainName(flag string) (name, why string) {
	if chainNameOK(flag) {
		return flag, ""
	}
	why = "nft cannot read back a chain named " + strconv.Quote(flag) + " (a saved ruleset would not load with nft -f)"
	switch {
	case flag == BaseChainName || flag == MasqChainName:
		why = "the name is taken by the agent's own chain " + strconv.Quote(flag)
	case nftNameRE.MatchString(flag) && len(flag) <= maxChainName:
		why = "a name of lowercase letters, digits and '-' only may be a keyword of nft (mark, counter, return ...), which nft cannot read back as a chain name (a saved ruleset would not load with nft -f)"
	}
	if up := strings.ToUpper(flag); chainNameOK(up) {
		return up, why
	}
	return DefaultChain, why
}

func chainNameOK(s string) bool {
	return len(s) <= maxChainName && nftNameRE.MatchString(s) && nftKeywordSafe.MatchString(s) &&
		s != BaseChainName && s != MasqChainName
}

// ParsePorts parses --to-ports as the original agent did
// (pkg/interval.ParseIntervals, then iptables' --to-ports): ports or
// ranges FIRST-LAST separated by commas, each number as strconv.Atoi reads
// it ("+1024" and "01024" are 1024: the original wrote them back in
// decimal), FIRST <= LAST; no spaces. Ranges may overlap: each range is
// chosen with a probability proportional to its size, as the original's
// "-m statistic" rules did. Empty means no port restriction. Port 0 is
// what iptables-restore installed for the original (PortsNote says what
// the kernel makes of it).
//
// One difference: a port above 65535 passed the original's parser but
// iptables-restore refused the rule at every sync, so the original never
// programmed anything; here it is refused at start.
func ParsePorts(s string) ([]PortRange, error) {
	if s == "" {
		return nil, nil
	}
	var out []PortRange
	for _, part := range strings.Split(s, ",") {
		fields := strings.Split(part, "-")
		if len(fields) > 2 {
			return nil, fmt.Errorf("--to-ports %q: %q is not a port or a range FIRST-LAST", s, part)
		}
		var ports [2]int
		for i, f := range fields {
			n, err := strconv.Atoi(f)
			if err != nil {
				return nil, fmt.Errorf("--to-ports %q: %q is not a port or a range FIRST-LAST", s, part)
			}
			if n < 0 || n > 65535 {
				return nil, fmt.Errorf("--to-ports %q: %d is not a port (0-65535)", s, n)
			}
			ports[i] = n
		}
		if len(fields) == 1 {
			ports[1] = ports[0]
		}
		if ports[0] > ports[1] {
			return nil, fmt.Errorf("--to-ports %q: first is greater than last in %q", s, part)
		}
		out = append(out, PortRange{First: uint16(ports[0]), Last: uint16(ports[1])})
	}
	return out, nil
}

// PortsNote says what the kernel makes of --to-ports ranges that reach
// port 0, which the original's iptables-restore installed as given and
// this agent installs the same ("" when none does). The kernel's NAT takes
// a port range as it is: 0 or 0-0 maps every tcp, udp and sctp connection
// to source port 0 (test/inputs_test.go sees them leave so, unanswered);
// a range from 0 may pick 0 and ports below 1024, which without
// --to-ports it keeps for sources below 1024 only.
func PortsNote(flag string, ports []PortRange) string {
	var zero, from0 []string
	for _, p := range ports {
		switch {
		case p.First == 0 && p.Last == 0:
			zero = append(zero, "0")
		case p.First == 0:
			from0 = append(from0, fmt.Sprintf("0-%d", p.Last))
		}
	}
	var notes []string
	if len(zero) > 0 {
		notes = append(notes, "port 0 alone masquerades every tcp, udp and sctp connection to source port 0, "+
			"which hosts do not answer: those connections fail, as they did with the original agent")
	}
	if len(from0) > 0 {
		notes = append(notes, "a range from 0 ("+strings.Join(from0, ", ")+") lets the kernel pick source port 0 and ports below 1024")
	}
	if len(notes) == 0 {
		return ""
	}
	return fmt.Sprintf("--to-ports=%s: installed as the original agent's iptables-restore installed it (masquerade to :%s): %s; "+
		"to leave the kernel its default ports, give no --to-ports, or a range such as 1024-65535", flag, portsText(ports), strings.Join(notes, "; "))
}

func portsText(ports []PortRange) string {
	s := make([]string, len(ports))
	for i, p := range ports {
		s[i] = strconv.Itoa(int(p.First))
		if p.Last != p.First {
			s[i] += "-" + strconv.Itoa(int(p.Last))
		}
	}
	return strings.Join(s, ",")
}

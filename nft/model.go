// Package nft turns a config into the agent's nftables ruleset (Build, pure)
// and makes the kernel hold exactly that ruleset (Apply, the only kernel I/O).
package nft

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Names of the kernel objects the agent owns. The agent reads and writes
// nothing outside table inet ip-masq-agent.
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
)

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

// Ruleset is the whole content of the agent's table: plain data, compared and
// rendered without touching the kernel.
type Ruleset struct {
	Chain string // the decision chain, named by --masq-chain
	Sets  []Set  // always the same four sets, in this order
	Base  []Rule // rules of BaseChainName
	Rules []Rule // rules of Chain
	Masq  []Rule // rules of MasqChainName
}

// chains returns the rules of the base, decision and masquerade chains, in
// the order of objects.chains.
func (rs Ruleset) chains() [3][]Rule { return [3][]Rule{rs.Base, rs.Rules, rs.Masq} }

// Equal reports whether two rulesets are the same.
func (rs Ruleset) Equal(o Ruleset) bool {
	a, b := rs.chains(), o.chains()
	for i := range a {
		if !slices.EqualFunc(a[i], b[i], Rule.equal) {
			return false
		}
	}
	return rs.Chain == o.Chain && slices.EqualFunc(rs.Sets, o.Sets, Set.equal)
}

func (s Set) equal(o Set) bool {
	return s.Name == o.Name && s.Family == o.Family && s.Comment == o.Comment && slices.Equal(s.Prefixes, o.Prefixes)
}

func (r Rule) equal(o Rule) bool {
	return r.NotLocal == o.NotLocal && r.Family == o.Family && r.DaddrSet == o.DaddrSet && r.L4Proto == o.L4Proto &&
		ptrEqual(r.Share, o.Share) && r.Verdict == o.Verdict && r.Target == o.Target &&
		ptrEqual(r.Ports, o.Ports) && r.FullyRandom == o.FullyRandom && r.Comment == o.Comment
}

func ptrEqual[T comparable](a, b *T) bool { return a == b || (a != nil && b != nil && *a == *b) }

// Set is an interval set of destination prefixes of one family. Prefixes are
// normalized: masked, sorted, no duplicates, none contained in another.
type Set struct {
	Name     string
	Family   Family
	Comment  string
	Prefixes []netip.Prefix
}

// Rule is one rule as a conjunction of optional matches, a counter (always,
// placed before the verdict so that it counts) and a verdict.
type Rule struct {
	NotLocal    bool   // fib daddr type != local
	Family      Family // meta nfproto ipv4/ipv6 (implied by DaddrSet)
	DaddrSet    string // ip/ip6 daddr @set
	L4Proto     uint8  // meta l4proto
	Share       *Share // numgen random mod Of < Below
	Verdict     Verdict
	Target      string     // chain for Jump and Goto
	Ports       *PortRange // masquerade to :First-Last
	FullyRandom bool       // masquerade fully-random
	Comment     string
}

// Share matches a random Below out of Of connections.
type Share struct{ Below, Of uint32 }

// PortRange is an inclusive range of source ports.
type PortRange struct{ First, Last uint16 }

func (p PortRange) size() uint32 { return uint32(p.Last) - uint32(p.First) + 1 }

func (p PortRange) String() string { return fmt.Sprintf("%d-%d", p.First, p.Last) }

// Options are the command-line flags that shape the ruleset.
type Options struct {
	Chain       string      // --masq-chain
	EnableIPv6  bool        // --enable-ipv6
	RandomFully bool        // --random-fully
	ToPorts     []PortRange // --to-ports
}

var chainNameRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_.-]{0,63}$`)

// ValidateChain checks a --masq-chain value: a plain nft identifier that is
// not one of the agent's other chains.
func ValidateChain(name string) error {
	if !chainNameRE.MatchString(name) {
		return fmt.Errorf("--masq-chain %q: want a letter, then up to 63 letters, digits, '_', '.' or '-'", name)
	}
	if name == BaseChainName || name == MasqChainName {
		return fmt.Errorf("--masq-chain %q: the name is taken by the agent's own %q chain", name, name)
	}
	return nil
}

// ParsePorts parses --to-ports: comma-separated ports or port ranges, as in
// "1024-29999,32768-65535". Empty means no port restriction.
func ParsePorts(s string) ([]PortRange, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []PortRange
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		first, err1 := strconv.ParseUint(lo, 10, 16)
		last, err2 := first, error(nil)
		if isRange {
			last, err2 = strconv.ParseUint(hi, 10, 16)
		}
		if err1 != nil || err2 != nil || first == 0 || last < first {
			return nil, fmt.Errorf("--to-ports %q: %q is not a port (1-65535) or a range first-last", s, part)
		}
		r := PortRange{uint16(first), uint16(last)}
		for _, o := range out {
			if r.First <= o.Last && o.First <= r.Last {
				return nil, fmt.Errorf("--to-ports %q: ranges %s and %s overlap", s, o, r)
			}
		}
		out = append(out, r)
	}
	return out, nil
}

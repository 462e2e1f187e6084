package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
	"github.com/ip-masq-agent/ip-masq-agent-nft/original"
)

var explainCommand = &command{
	name: "explain", args: "[--config FILE|DIR] [--live] [--from SOURCE] [--via IFACE] [flags] ADDRESS...",
	summary: "say whether traffic to each address is masqueraded, and which rule decides",
	about: `For each destination ADDRESS, says whether new connections from pods to it
are masqueraded, and why: the CIDR and the key it comes from (such as
"nonMasqueradeCIDRs[2] 10.0.0.0/8"), the link-local default, or the
outbound default, from the config and flags alone. --from SOURCE is the
connections' source (a pod's address), which nonMasqueradeSourceCIDRs
and masqueradeSourceCIDRs decide on; without it, a config with either key
is "undetermined". --via IFACE is the interface they leave through, which
egressInterfaces decides on; with --live and without --via, it is the
interface the node's routing table gives now (ip route get ADDRESS from
SOURCE iif DEV).

In the agent's pod (kubectl exec), the flags not given here are the running
agent's (--agent-pid), so the answer is for the config and flags in force.

--live also reads the kernel's current table inet ip-masq-agent (needs
CAP_NET_ADMIN, run it on the node, e.g. in the agent's pod) and evaluates
its rules as the kernel does, with the node's own addresses (never
masqueraded); it prints both answers and DISAGREE where they differ (then
"ip-masq-agent diff" says what differs). While the original (iptables)
agent's rules are there, an address whose decision the switch from them
changes gets both decisions, the original's and this agent's, and the
flag or key that would keep the original's ("original: ..." and
"SWITCH: ..."). With a bad config (a ConfigMap edit the agent refuses),
--live says so on stderr in one line (file, key, value) and still prints
what the kernel does now for each address.
Exit status: 0; 1 when --live found a disagreement or a decision the
switch changes; 2 on errors (without --live, a bad config); 3 when the
config is bad and --live answered from the kernel.`,
	example: "ip-masq-agent explain --config ip-masq-agent.yaml 10.0.0.1 169.254.169.254 203.0.113.10\n" +
		"  ip-masq-agent explain --live 10.96.0.10",
	run: runExplain,
}

func runExplain(c *command, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("explain", flag.ContinueOnError)
	live := fs.Bool("live", false, "also evaluate the kernel's current table (CAP_NET_ADMIN) and say where it disagrees")
	from := fs.String("from", "", "the connections' source address (a pod's), for nonMasqueradeSourceCIDRs and masqueradeSourceCIDRs")
	via := fs.String("via", "", "the interface the connections leave through, for egressInterfaces (with --live, the node's route by default)")
	r, cfg, pos, cfgErr, code, done := rulesetCommandBadConfig(c, fs, args, stdout, stderr)
	if done {
		return code
	}
	if cfgErr != nil && !*live {
		fmt.Fprintf(stderr, "ip-masq-agent explain: %v\n", cfgErr)
		return 2
	}
	if len(pos) == 0 {
		return usageError(c, stderr, "no ADDRESS given")
	}
	var src netip.Addr
	if *from != "" {
		a, err := netip.ParseAddr(*from)
		if err != nil || a.Zone() != "" {
			return usageError(c, stderr, "--from %q is not an IP address", *from)
		}
		src = a
	}
	if _, ok := nft.IfnamePrefix(*via); *via != "" && (!ok || strings.HasSuffix(*via, "*")) {
		return usageError(c, stderr, "--via %q is not an interface name", *via)
	}
	var addrs []netip.Addr
	for _, s := range pos {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return usageError(c, stderr, "%q is not an IP address", s)
		}
		addrs = append(addrs, a)
	}
	if !*live {
		width := 0
		for _, a := range addrs {
			width = max(width, len(a.String()))
		}
		for _, a := range addrs {
			e := nft.Explain(cfg, r.nft, nft.Packet{Src: src, Dst: a, OutIf: *via})
			fmt.Fprintf(stdout, "%-*s  %-15s  %s\n", width, a, e.Verdict(), e.Reason)
		}
		return 0
	}
	table, err := readTable()
	if err != nil {
		fmt.Fprintf(stderr, "ip-masq-agent explain --live: %v\n", hint(err))
		return 2
	}
	orig, oerr := readOriginal("")
	if oerr != nil {
		fmt.Fprintf(stderr, "ip-masq-agent explain --live: cannot look for the original agent's iptables rules: %v\n", hint(oerr))
	}
	if cfgErr != nil {
		// The commonest incident: the kernel's answer matters most now.
		fmt.Fprintf(stderr, "ip-masq-agent explain --live: %s\n", badConfigLine(cfgErr))
	}
	local := localAddrs()
	var cmp original.Comparison
	if oerr == nil && cfgErr == nil {
		cmp = original.Compare(orig, cfg, r.flags, r.nft)
	}
	built := r.nft // the options the agent built the live table with
	if cfgErr == nil {
		built = asBuilt(table, cfg, r.nft)
	}
	disagree := 0
	for _, a := range addrs {
		pkt := nft.Packet{Src: src, Dst: a, OutIf: *via}
		if pkt.OutIf == "" {
			pkt.OutIf = routeOutIf(src, a) // as the kernel would route it now
		}
		got := nft.Explanation{Addr: a.Unmap(), Reason: "table inet " + nft.TableName + " does not exist: nothing is masqueraded by it"}
		if table != nil {
			got = nft.ExplainTable(table, pkt, local)
		}
		// The original agent's jump, in iptables' nat POSTROUTING, runs first.
		first, decided := orig.ExplainOriginal(a, local(a))
		if decided {
			got = first
		} else if first.Reason != "" {
			got.Reason = first.Reason + "; then " + got.Reason
		}
		if cfgErr != nil {
			fmt.Fprintf(stdout, "%s\n  config: bad, not applied (see the line on stderr)\n  kernel: %s: %s\n", a, got.Verdict(), got.Reason)
			if got.Rule != "" {
				fmt.Fprintf(stdout, "          rule: %s\n", got.Rule)
			}
			continue
		}
		want := nft.Explain(cfg, built, pkt)
		fmt.Fprintf(stdout, "%s\n  config: %s: %s\n  kernel: %s: %s\n", a, want.Verdict(), want.Reason, got.Verdict(), got.Reason)
		if *via == "" && pkt.OutIf != "" && (matchesOutIf(nft.Build(cfg, r.nft)) || (table != nil && matchesOutIf(*table))) {
			fmt.Fprintf(stdout, "  route:  leaves through %s (the node's route now)\n", pkt.OutIf)
		}
		if got.Rule != "" {
			fmt.Fprintf(stdout, "          rule: %s\n", got.Rule)
		}
		// Both decisions of the switch from the original, where it changes one.
		flagged := false
		d, ok := switchChanges(cmp, a)
		if !ok && cmp.Inexact {
			// A range the comparison may have missed: decided here alone.
			d, ok = original.At(orig, cfg, r.flags, r.nft, a)
		}
		if ok && !local(a) {
			why := first.Reason
			if !decided {
				why = "not masqueraded by the original's rules"
				if first.Reason != "" {
					why = first.Reason
				}
			}
			fmt.Fprintf(stdout, "  original: %s: %s\n", d.Original, why)
			fmt.Fprintf(stdout, "  SWITCH: %s (see ip-masq-agent diff --decisions)\n", d)
			flagged = true
		}
		switch {
		case got.Undetermined || got.Masquerade != want.Masquerade:
			if local(want.Addr) && !got.Masquerade && !got.Undetermined {
				fmt.Fprintln(stdout, "  (the address is the node's own: the kernel never masquerades it, whatever the config)")
				break
			}
			if decided && keeps(orig, r.nft, a) {
				fmt.Fprintln(stdout, "  (the original ip-masq-agent's rules of this family stay: this agent does not program it, see ip-masq-agent diff)")
				break
			}
			flagged = true
			fmt.Fprintln(stdout, "  DISAGREE: the kernel's table does not do what the config says (see ip-masq-agent diff)")
		}
		if flagged {
			disagree++
		}
	}
	if cfgErr != nil {
		return exitBadConfig
	}
	if disagree > 0 {
		return 1
	}
	return 0
}

// switchChanges returns the range of c that holds a: the switch from the
// original agent changes a's decision.
func switchChanges(c original.Comparison, a netip.Addr) (original.Difference, bool) {
	a = a.Unmap()
	for _, d := range c.Differences {
		if d.Range.Contains(a) {
			return d, true
		}
	}
	return original.Difference{}, false
}

// keeps reports whether the original's rules of a's family stay: this
// agent does not program the family.
func keeps(o original.Rules, opts nft.Options, a netip.Addr) bool {
	fam := nft.Family(4)
	if a.Unmap().Is6() {
		fam = 6
	}
	for _, f := range o.KeptFamilies(opts) {
		if f.Family == fam {
			return true
		}
	}
	return false
}

// localAddrs returns whether an address is one of the node's own (its
// interfaces' addresses and the loopback ranges), as fib daddr type local
// would find.
func localAddrs() func(netip.Addr) bool {
	own := map[netip.Addr]bool{}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil {
				own[p.Addr().Unmap()] = true
			}
		}
	}
	loop4 := netip.MustParsePrefix("127.0.0.0/8")
	return func(a netip.Addr) bool {
		a = a.Unmap()
		return own[a] || loop4.Contains(a) || a == netip.IPv6Loopback()
	}
}

package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft/kernel"
	"github.com/ip-masq-agent/ip-masq-agent-nft/original"
)

var cleanupIptablesCommand = &command{
	name: "cleanup-iptables", args: "[--masq-chain NAME] [--family ipv4|ipv6|all] [--watch DURATION]",
	summary: "remove the original (iptables) ip-masq-agent's chains and POSTROUTING jumps, IPv4 and IPv6",
	about: `Removes what the original iptables ip-masq-agent left in the node's
iptables-nft nat tables (table ip nat and table ip6 nat), in one
transaction: its chains and the POSTROUTING rules that jump to them. They
are found by what they are, whatever --masq-chain the original ran with:
the POSTROUTING rules that carry the original's comment ("ip-masq-agent:
ensure nat POSTROUTING directs all non-LOCAL destination traffic to our
custom ... chain", with or without the double quotes that Azure's
ip-masq-agent-v2 and the original's v2.10-v2.12.1 leave in it) and the
chains they jump to, and chains called IP-MASQ-AGENT or IP-MASQ whose
every rule carries the original's comments. A chain of those names that
holds anything else is not the original's: it is reported and left alone,
as the daemon, diff and explain say; only --masq-chain NAME given on this
command line removes the chain NAME (and the jumps to it) whatever it
holds (a --masq-chain taken from the running agent only names the chain
of the legacy commands). --family ipv4 or ipv6 removes that family's only:
the daemon never removes the original's IPv6 rules when it runs without
--enable-ipv6 (removing them would stop masquerading IPv6); this does it
deliberately; without --family, beside a running agent without
--enable-ipv6 (the flags taken from --agent-pid), only IPv4's go.
Nothing else is touched. The daemon does the same by
itself once the original agent is gone (its chains unchanged for twice
the longest resync interval in force plus 5s); this command does it now.
Needs CAP_NET_ADMIN: run it on the node.

Before removing, it watches the chain for --watch: the original agent
rewrites its chain at every resync, so a chain rewritten meanwhile means
the original agent still runs and will put its rules back at its next
resync (delete its DaemonSet first). It warns and removes them anyway.

Rules written by iptables-legacy cannot be seen over nftables: when a
legacy nat table exists, the commands that remove the original's rules
from it are printed.

Exit status: 0 when the rules were removed or there were none; 1 on a
failure (nothing was removed); 2 on bad usage; 3 when they were removed
but the chain was rewritten during --watch (the original agent still runs).`,
	example: "ip-masq-agent cleanup-iptables\n  ip-masq-agent cleanup-iptables --masq-chain IP-MASQ --watch 0",
	run:     runCleanupIptables,
}

func runCleanupIptables(c *command, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("cleanup-iptables", flag.ContinueOnError)
	chain := fs.String("masq-chain", "", "also remove this chain (and the jumps to it) whatever it holds; the original's chains are found without it")
	watch := fs.Duration("watch", 3*time.Second, "watch the chain this long before removing it, to tell whether the original agent still rewrites it (0: do not watch)")
	family := fs.String("family", "all", "remove the original's rules of this family only: ipv4, ipv6 or all")
	agentPID := fs.String("agent-pid", "auto", "take --masq-chain, when not given, from the running agent's command line, for the legacy commands: auto (process 1 when it is the agent, as in its pod), a PID, or none")
	pos, code, done := c.parse(fs, args, stdout, stderr)
	if done {
		return code
	}
	named := ""
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "masq-chain" {
			named = f.Value.String()
		}
	})
	if err := adoptAgentFlags(fs, *agentPID, stderr); err != nil {
		return usageError(c, stderr, "%v", err)
	}
	familyGiven := false
	fs.Visit(func(f *flag.Flag) { familyGiven = familyGiven || f.Name == "family" })
	var fams []nft.Family
	switch *family {
	case "ipv4":
		fams = []nft.Family{4}
	case "ipv6":
		fams = []nft.Family{6}
	case "all":
	default:
		return usageError(c, stderr, "--family %q: want ipv4, ipv6 or all", *family)
	}
	if len(pos) > 0 {
		return usageError(c, stderr, "unexpected arguments: %s", strings.Join(pos, " "))
	}
	// Beside a running agent that does not program IPv6, the original's
	// IPv6 rules are the masquerade nothing takes over (the daemon keeps
	// them): removed only when asked for with --family.
	if d, _, found, _ := runningAgent(*agentPID); found && !familyGiven && !d.flags.EnableIPv6 {
		fams = []nft.Family{4}
		fmt.Fprintln(stderr, "note: the original's IPv6 rules (table ip6 nat), if any, stay: the running agent has no --enable-ipv6 and does not take IPv6 over; "+
			"removing them would stop masquerading that traffic (--family ipv6 or all removes them deliberately)")
	}
	if *watch < 0 {
		return usageError(c, stderr, "--watch %s: want 0 or more", *watch)
	}
	n := &kernel.Netlink{}
	defer n.Close()
	k := original.Netlink{K: n}
	o, err := k.FindOriginal(named)
	o = o.Of(fams...)
	if err != nil {
		fmt.Fprintf(stderr, "ip-masq-agent cleanup-iptables: %v\n", hint(err))
		return 1
	}
	legacyChain := *chain
	if legacyChain == "" {
		legacyChain = nft.DefaultChain
	}
	for _, tool := range o.Legacy {
		fmt.Fprintf(stderr, "warning: a legacy %s nat table exists: rules written by %s-legacy cannot be seen over nftables; if the original agent used it, remove its rules with (its --masq-chain for %s):\n  %s\n",
			tool, tool, legacyChain, strings.Join(original.LegacyCommands(legacyChain, tool), "\n  "))
	}
	for _, f := range o.Foreign() {
		fmt.Fprintf(stderr, "warning: not removed: %s: no rule carries the original ip-masq-agent's comments; if it is the original's, run: ip-masq-agent cleanup-iptables --masq-chain %s\n", f.Summary(), f.Chain)
	}
	if o.Fingerprint() == "" {
		what := "no chain of the original ip-masq-agent's (found by its comments, or called " + nft.DefaultChain + " or " + original.AddonChain + ")"
		if named != "" {
			what += " and no chain " + named
		}
		fmt.Fprintf(stdout, "%s in %s: nothing to remove\n", what, tablesOf(fams))
		return 0
	}
	for _, f := range o.Families {
		switch {
		case !o.Removable(f):
		case f.Recognised():
			fmt.Fprintf(stdout, "found the original ip-masq-agent's chain %s in table %s (the --masq-chain it ran with)\n", f.Chain, f.Table())
		default:
			fmt.Fprintf(stdout, "found chain %s in table %s: not the original ip-masq-agent's rules, removed as --masq-chain %s asks\n", f.Chain, f.Table(), f.Chain)
		}
	}
	alive := false
	if *watch > 0 {
		time.Sleep(*watch)
		again, err := k.FindOriginal(named)
		again = again.Of(fams...)
		if err != nil {
			fmt.Fprintf(stderr, "ip-masq-agent cleanup-iptables: %v\n", hint(err))
			return 1
		}
		if again.Fingerprint() != o.Fingerprint() {
			alive = true
			fmt.Fprintf(stderr, "warning: chain %s was rewritten within the last %s: the original ip-masq-agent still runs and will put its rules back at its next resync; stop it (delete its DaemonSet) and run this again\n", strings.Join(again.Chains(), ", "), *watch)
		}
		o = again
	}
	removed, err := k.RemoveOriginal(named, o.Fingerprint(), fams...)
	if errors.Is(err, original.ErrChanged) {
		alive = true
		removed, err = k.RemoveOriginal(named, "", fams...)
	}
	if err != nil {
		fmt.Fprintf(stderr, "ip-masq-agent cleanup-iptables: %v\n", hint(err))
		return 1
	}
	for _, f := range removed.Families {
		if f.Present() {
			fmt.Fprintf(stdout, "removed from %s\n", f.Summary())
		}
	}
	if alive {
		return 3
	}
	return 0
}

// tablesOf names the nat tables of the families (none: both).
func tablesOf(fams []nft.Family) string {
	switch {
	case len(fams) == 1 && fams[0] == 4:
		return "table ip nat"
	case len(fams) == 1:
		return "table ip6 nat"
	}
	return "table ip nat or ip6 nat"
}

package main

import (
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
	"github.com/ip-masq-agent/ip-masq-agent-nft/original"
)

var diffCommand = &command{
	name: "diff", args: "[--config FILE|DIR] [--decisions] [flags]",
	summary: "show what the agent would change in the kernel's table, and which decisions the switch from the original agent changes; exit 0 when nothing, 1 when something",
	about: `Reads the kernel's current table inet ip-masq-agent (needs CAP_NET_ADMIN:
run it on the node) and prints the transaction the agent, with this config
and these flags, would send to it: exactly the plan the daemon sends, one
operation a line in nft syntax, e.g.

  delete element inet ip-masq-agent nonmasq-v4 { 10.0.0.0/8 }
  add element inet ip-masq-agent nonmasq-v4 { 10.1.0.0/16 }
  flush chain inet ip-masq-agent IP-MASQ-AGENT
  add rule inet ip-masq-agent IP-MASQ-AGENT ip daddr @masq-v4 counter goto masq-to-node ...

When the original (iptables) ip-masq-agent's rules are on the node, it
also compares their decisions with this config's and flags': every
destination range that the switch changes (masquerade or not), one line
each, with both decisions and the flag or key that would keep the
original's, then a summary line:

  change ipv4 100.64.0.0/10: original: not masqueraded, this agent: masquerade; to keep the original's decision: --nomasq-all-reserved-ranges (the original ran with it)
    original: ...
    this agent: ...
  decisions: the switch from the original ip-masq-agent changes 8 ranges (ipv4 8, ipv6 0)

or "decisions: the switch from the original ip-masq-agent changes none"
(never when a hand-edited rule of the original's cannot be followed
exactly: then a note says so and diff exits 1).
The original's rules of a family this agent does not program stay
("kept ipv6: ..."), and so does a chain of the original's name that is not
its rules ("left alone: ..."); neither changes a decision.

With a bad config (a ConfigMap edit the agent refuses) there is nothing to
compare with: diff says so on stderr in one line (file, key, value), and on
stdout whether the kernel holds the table, which the agent keeps as it is
("ip-masq-agent list" prints it; "explain --live" says what it does).

--decisions prints the comparison only, without reading the table: the
check before the switch, run on the node with the image, flags and
ConfigMap about to be installed while the original still runs
(docs/upgrade.md, Before the switch).

Exit status: 0 and "in sync" when the table is what the agent would
program and no decision changes; 1 when it differs or is missing ("table
inet ip-masq-agent missing"), when the original agent's rules that this
agent takes over still decide first, or when the switch changes a
decision; with --decisions, 0 when the switch changes no decision and 1
when it changes some, or when a legacy iptables nat table holds what
cannot be compared; 2 on errors; 3 when the config is bad.`,
	example: "ip-masq-agent diff --config /etc/config/ip-masq-agent\n" +
		"  ip-masq-agent diff --decisions --agent-pid none --config /etc/config/ip-masq-agent --nomasq-all-reserved-ranges",
	run: runDiff,
}

func runDiff(c *command, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("diff", flag.ContinueOnError)
	decisions := fs.Bool("decisions", false, "compare the original agent's decisions with this config's and flags' only; do not read the agent's table")
	r, cfg, pos, cfgErr, code, done := rulesetCommandBadConfig(c, fs, args, stdout, stderr)
	if done {
		return code
	}
	if *decisions {
		if len(pos) > 0 {
			return usageError(c, stderr, "unexpected arguments: %s", strings.Join(pos, " "))
		}
		if cfgErr != nil {
			// Nothing to compare with: the agent would refuse this config.
			fmt.Fprintf(stderr, "ip-masq-agent diff: %s\n", badConfigLine(cfgErr))
			return exitBadConfig
		}
		o, err := readOriginal("")
		if err != nil {
			fmt.Fprintf(stderr, "ip-masq-agent diff: cannot look for the original agent's iptables rules: %v\n", hint(err))
			return 2
		}
		printFound(stdout, o)
		cmp := original.Compare(o, cfg, r.flags, r.nft)
		if !cmp.Found && len(o.Legacy) > 0 {
			// The original run with iptables-legacy: its rules, if there,
			// cannot be seen; passing would hide every change.
			fmt.Fprintf(stdout, "decisions: not compared: no rules of the original ip-masq-agent in table ip nat or ip6 nat, but a legacy %s nat table exists, where an original run with iptables-legacy keeps them unseen; "+
				"list them with %s-legacy-save -t nat and compare by hand (explain ADDRESS says what this agent decides)\n", strings.Join(o.Legacy, " and "), o.Legacy[0])
			return 1
		}
		if !cmp.Found {
			fmt.Fprintln(stdout, "decisions: no rules of the original ip-masq-agent in table ip nat or ip6 nat: no switch to compare")
			return 0
		}
		if printComparison(stdout, cmp) > 0 {
			return 1
		}
		return 0
	}
	table, code, ok := liveTable(c, pos, stderr)
	if !ok {
		if cfgErr != nil {
			fmt.Fprintf(stderr, "ip-masq-agent diff: %s\n", badConfigLine(cfgErr))
		}
		return code
	}
	// The original agent's jump, when there, decides before this table.
	first, changes := 0, 0
	if o, err := readOriginal(""); err != nil {
		fmt.Fprintf(stderr, "ip-masq-agent diff: cannot look for the original agent's iptables rules: %v\n", hint(err))
	} else {
		first = printOriginal(stdout, o, r.nft)
		if cfgErr == nil {
			changes = printComparison(stdout, original.Compare(o, cfg, r.flags, r.nft))
		}
	}
	if cfgErr != nil {
		fmt.Fprintf(stderr, "ip-masq-agent diff: %s\n", badConfigLine(cfgErr))
		if table == nil {
			fmt.Fprintf(stdout, "table inet %s missing: the agent creates none while the config is bad\n", nft.TableName)
		} else {
			fmt.Fprintf(stdout, "table inet %s kept as it is while the config is bad (ip-masq-agent list prints it)\n", nft.TableName)
		}
		return exitBadConfig
	}
	if table == nil {
		fmt.Fprintf(stdout, "table inet %s missing: the agent would create it\n", nft.TableName)
		return 1
	}
	p := nft.DiffPlan(table, nft.Build(cfg, asBuilt(table, cfg, r.nft)))
	if p.Empty() {
		if first > 0 {
			fmt.Fprintln(stdout, "table inet "+nft.TableName+" in sync, but the original agent's rules decide first")
			return 1
		}
		if changes > 0 {
			fmt.Fprintln(stdout, "table inet "+nft.TableName+" in sync, but the switch from the original agent changes decisions")
			return 1
		}
		fmt.Fprintln(stdout, "in sync")
		return 0
	}
	fmt.Fprint(stdout, p)
	return 1
}

// printOriginal prints the original agent's jumps that decide before the
// agent's table, what of them stays and why, and the legacy tables it
// cannot see; it returns how many jumps the agent takes over.
func printOriginal(w io.Writer, o original.Rules, opts nft.Options) int {
	n := 0
	taken := o.TakenOver(opts)
	for _, f := range taken.Families {
		if !taken.Removable(f) {
			continue
		}
		for _, j := range f.Jumps {
			n++
			fmt.Fprintf(w, "table %s chain POSTROUTING: the original ip-masq-agent's jump to chain %s (its --masq-chain) decides first (iptables nat POSTROUTING, priority srcnat, runs before table inet %s at srcnat + 10):\n  %s\n",
				f.Table(), f.Chain, nft.TableName, j)
		}
	}
	if n > 0 {
		fmt.Fprintln(w, "  (the agent removes it once the original agent is gone; ip-masq-agent cleanup-iptables removes it now)")
	}
	printLeftAlone(w, o)
	printLegacy(w, o)
	return n
}

// printFound says which of the original agent's rules were found, for
// diff --decisions.
func printFound(w io.Writer, o original.Rules) {
	for _, f := range o.Families {
		if o.Removable(f) {
			fmt.Fprintf(w, "original: %s\n", f.Summary())
		}
	}
	printLeftAlone(w, o)
	printLegacy(w, o)
}

// printLeftAlone names the chains of the original's names that are not
// its rules: the daemon leaves them alone, and so does this answer.
func printLeftAlone(w io.Writer, o original.Rules) {
	for _, f := range o.Foreign() {
		fmt.Fprintf(w, "left alone: %s: it has a name of the original ip-masq-agent's but not its rules; the agent never removes it (ip-masq-agent cleanup-iptables --masq-chain %s does, if it is the original's)\n",
			f.Summary(), f.Chain)
	}
}

func printLegacy(w io.Writer, o original.Rules) {
	chain := o.Chain
	if chain == "" {
		chain = nft.DefaultChain
	}
	for _, tool := range o.Legacy {
		fmt.Fprintf(w, "note: a legacy %s nat table exists; rules there cannot be seen (nor compared); if the original agent used iptables-legacy, remove them with (its --masq-chain for %s):\n  %s\n",
			tool, chain, strings.Join(original.LegacyCommands(chain, tool), "\n  "))
	}
}

// printComparison prints what the switch from the original's rules
// changes, a line a range, then a summary line; it returns the number of
// ranges (1 when none was found but the comparison is inexact). Nothing
// when the original agent's rules are not there.
func printComparison(w io.Writer, c original.Comparison) int {
	if !c.Found {
		return 0
	}
	for _, f := range c.Kept {
		fmt.Fprintf(w, "kept %s: the original ip-masq-agent's rules in table %s stay: this agent does not program %s (no --enable-ipv6), and removing them would stop masquerading that traffic; "+
			"to take it over add --enable-ipv6, or remove them deliberately with ip-masq-agent cleanup-iptables --family %s\n", f.MetricFamily(), f.Table(), f.MetricFamily(), f.MetricFamily())
	}
	for _, d := range c.Differences {
		fmt.Fprintf(w, "change %s\n", d)
		if d.OriginalWhy != "" {
			fmt.Fprintf(w, "  original: %s\n  this agent: %s\n", d.OriginalWhy, d.AgentWhy)
		}
	}
	for _, n := range c.Notes {
		fmt.Fprintf(w, "change %s\n", n)
	}
	if c.Inexact {
		fmt.Fprintln(w, "note: a rule of the original's compares the destination in a way not followed here: ranges may be missing")
	}
	if len(c.Differences) == 0 && len(c.Notes) > 0 {
		fmt.Fprintln(w, "decisions: the switch from the original ip-masq-agent changes no range, but the source ports of masqueraded traffic (above)")
		return len(c.Notes)
	}
	if len(c.Differences) == 0 && c.Inexact {
		// Not proven unchanged: counted as a change (exit 1).
		fmt.Fprintln(w, "decisions: the switch from the original ip-masq-agent changes no range found, but may change ranges not followed here (explain --live ADDRESS shows both decisions)")
		return 1
	}
	if len(c.Differences) == 0 {
		fmt.Fprintln(w, "decisions: the switch from the original ip-masq-agent changes none")
		return 0
	}
	ranges := "ranges"
	if len(c.Differences) == 1 {
		ranges = "range"
	}
	fmt.Fprintf(w, "decisions: the switch from the original ip-masq-agent changes %d %s (ipv4 %d, ipv6 %d)\n", len(c.Differences), ranges, c.Count(4), c.Count(6))
	return len(c.Differences)
}

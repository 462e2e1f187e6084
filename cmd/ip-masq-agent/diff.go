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
	name: "diff", args: "[--config FILE|DIR] [flags]",
	summary: "show what the agent would change in the kernel's table; exit 0 when in sync, 1 when not",
	about: `Reads the kernel's current table inet ip-masq-agent (needs CAP_NET_ADMIN:
run it on the node) and prints the transaction the agent, with this config
and these flags, would send to it: exactly the plan the daemon sends, one
operation a line in nft syntax, e.g.

  delete element inet ip-masq-agent nonmasq-v4 { 10.0.0.0/8 }
  add element inet ip-masq-agent nonmasq-v4 { 10.1.0.0/16 }
  flush chain inet ip-masq-agent IP-MASQ-AGENT
  add rule inet ip-masq-agent IP-MASQ-AGENT ip daddr @masq-v4 counter goto masq-to-node ...

With a bad config (a ConfigMap edit the agent refuses) there is nothing to
compare with: diff says so on stderr in one line (file, key, value), and on
stdout whether the kernel holds the table, which the agent keeps as it is
("ip-masq-agent list" prints it; "explain --live" says what it does).

Exit status: 0 and "in sync" when the table is what the agent would
program; 1 when it differs or is missing ("table inet ip-masq-agent
missing"); 2 on errors; 3 when the config is bad.`,
	example: "ip-masq-agent diff --config /etc/config/ip-masq-agent",
	run:     runDiff,
}

func runDiff(c *command, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("diff", flag.ContinueOnError)
	r, cfg, pos, cfgErr, code, done := rulesetCommandBadConfig(c, fs, args, stdout, stderr)
	if done {
		return code
	}
	table, code, ok := liveTable(c, pos, stderr)
	if !ok {
		if cfgErr != nil {
			fmt.Fprintf(stderr, "ip-masq-agent diff: %s\n", badConfigLine(cfgErr))
		}
		return code
	}
	// The original agent's jump, when there, decides before this table.
	original := 0
	if o, err := readOriginal(""); err != nil {
		fmt.Fprintf(stderr, "ip-masq-agent diff: cannot look for the original agent's iptables rules: %v\n", hint(err))
	} else {
		original = printOriginal(stdout, o)
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
	p := nft.DiffPlan(table, nft.Build(cfg, r.nft))
	if p.Empty() {
		if original > 0 {
			fmt.Fprintln(stdout, "table inet "+nft.TableName+" in sync, but the original agent's rules decide first")
			return 1
		}
		fmt.Fprintln(stdout, "in sync")
		return 0
	}
	fmt.Fprint(stdout, p)
	return 1
}

// printOriginal prints the original agent's jumps that decide before the
// agent's table, and the legacy tables it cannot see; it returns how many
// jumps there are.
func printOriginal(w io.Writer, o original.Rules) int {
	n := 0
	for _, f := range o.Families {
		for _, j := range f.Jumps {
			n++
			who := "the original ip-masq-agent's jump to chain " + f.Chain + " (its --masq-chain)"
			if !o.Removable(f) {
				who = "a jump to chain " + f.Chain + " (a name of the original agent's, but not its rules)"
			}
			fmt.Fprintf(w, "table %s chain POSTROUTING: %s decides first (iptables nat POSTROUTING, priority srcnat, runs before table inet %s at srcnat + 10):\n  %s\n",
				f.Table(), who, nft.TableName, j)
		}
	}
	if n > 0 {
		fmt.Fprintln(w, "  (the agent removes it once the original agent is gone; ip-masq-agent cleanup-iptables removes it now)")
	}
	chain := o.Chain
	if chain == "" {
		chain = nft.DefaultChain
	}
	for _, tool := range o.Legacy {
		fmt.Fprintf(w, "note: a legacy %s nat table exists; rules there cannot be seen; if the original agent used iptables-legacy, remove them with (its --masq-chain for %s):\n  %s\n",
			tool, chain, strings.Join(original.LegacyCommands(chain, tool), "\n  "))
	}
	return n
}

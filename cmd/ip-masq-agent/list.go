package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

var listCommand = &command{
	name: "list", args: "",
	summary: "print the kernel's table inet ip-masq-agent in nft syntax, with counters and whether it is owned, orphaned or free",
	about: `Reads the kernel's table inet ip-masq-agent through the agent's own netlink
reader (needs CAP_NET_ADMIN: run it on the node, e.g. kubectl exec into the
agent's pod, where there is no nft) and prints it as nft list table would,
with each rule's counter. Whatever the table holds is shown, the agent's
or not; what the agent did not make is marked "not the agent's". The first
line says whether the table is owned (a running agent owns it), orphaned
(its owner exited without releasing it, e.g. killed; it persists) or free
(not owned: released at the agent's exit, --own-table=false, or a kernel
before 6.9).
Exit status: 0; 1 when there is no table; 2 on errors.`,
	example: "ip-masq-agent list\n  kubectl -n kube-system exec $POD -- /ip-masq-agent list   # $POD: the agent's pod on the node (docs/runbook.md)",
	run:     runList,
}

func runList(c *command, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("list", flag.ContinueOnError)
	pos, code, done := c.parse(fs, args, stdout, stderr)
	if done {
		return code
	}
	table, code, ok := liveTable(c, pos, stderr)
	if !ok {
		return code
	}
	if table == nil {
		fmt.Fprintf(stderr, "ip-masq-agent list: table inet %s does not exist\n", nft.TableName)
		return 1
	}
	fmt.Fprintln(stdout, ownership(*table))
	fmt.Fprint(stdout, nft.RenderCounters(*table))
	return 0
}

// ownership is list's first line: whether the table is owned, orphaned or
// free, and what that means for the node's nftables tools.
func ownership(t nft.Table) string {
	switch {
	case t.Owner != nft.NotOwned:
		return "# owned: a running process (the agent) owns it: every change by another process is refused, " +
			"and nft -f of a saved ruleset that holds it fails (EPERM); save rulesets without it (docs/upgrade.md)"
	case t.Persist:
		return "# orphaned: its owner exited; it stays in force (flags persist) until an agent adopts it; " +
			"nft 1.0.6 lists it with a bare \"flags \" line that nft -f refuses; save rulesets without it; an agent that exits on SIGTERM or after --once releases it unless --release-on-exit=false (docs/upgrade.md)"
	}
	return "# free: not owned (the agent exited and released it, --own-table=false, or a kernel before 6.9): any process may change it"
}

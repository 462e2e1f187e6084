package main

import (
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
	"github.com/ip-masq-agent/ip-masq-agent-nft/windows"
)

var renderCommand = &command{
	name: "render", args: "[--config FILE|DIR] [--format nft|windows-cni] [flags]",
	summary: "print the ruleset the agent would program (nft -f input), or the Windows CNI policy",
	about: `Prints the ruleset the agent would program for the config and flags, as
input for nft -f, which the real nft accepts. It needs no privileges and
does not touch the kernel. The first two lines ("table inet ip-masq-agent"
and "delete table inet ip-masq-agent") make nft -f replace an existing table
in the same transaction; --replace=false leaves them out, and the rest is
the table as nft list table prints it (counters at 0).

--config may also be a ConfigMap manifest (its data key "config" is read).

--format windows-cni prints the same config as the OutBoundNAT endpoint
policy of Windows nodes' CNI config (win-bridge, win-overlay: an entry of
"policies"), so that one ConfigMap serves mixed clusters. Its ExceptionList
holds the IPv4 nonMasqueradeCIDRs as written, then 169.254.0.0/16 unless
masqLinkLocal is true. It cannot express masqueradeCIDRs, masqOutBound:
false, nor IPv6: when the config sets them, a warning says so on stderr.`,
	example: "ip-masq-agent render --config ip-masq-agent.yaml | nft -c -f -\n" +
		"  ip-masq-agent render --config configmap.yaml --format windows-cni",
	run: runRender,
}

func runRender(c *command, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("render", flag.ContinueOnError)
	format := fs.String("format", "nft", "nft (input for nft -f) or windows-cni (the OutBoundNAT policy of Windows nodes)")
	replace := fs.Bool("replace", true, "begin with the lines that make nft -f replace an existing table")
	r, cfg, pos, code, done := rulesetCommand(c, fs, args, stdout, stderr)
	if done {
		return code
	}
	if len(pos) > 0 {
		return usageError(c, stderr, "unexpected arguments: %s", strings.Join(pos, " "))
	}
	switch *format {
	case "nft":
		if *replace {
			fmt.Fprintf(stdout, "table inet %s\ndelete table inet %s\n", nft.TableName, nft.TableName)
		}
		fmt.Fprint(stdout, nft.Render(nft.Build(cfg, r.nft)))
	case "windows-cni":
		p, warns := windows.For(cfg, r.flags.EnableIPv6)
		for _, w := range warns {
			fmt.Fprintln(stderr, "warning: "+w)
		}
		fmt.Fprint(stdout, windows.Render(p))
	default:
		return usageError(c, stderr, "--format %q: want nft or windows-cni", *format)
	}
	return 0
}

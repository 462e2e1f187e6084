package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

var validateCommand = &command{
	name: "validate", args: "[--strict] [--enable-ipv6] [--nomasq-all-reserved-ranges] [--masq-chain NAME] [--to-ports PORTS] FILE...",
	summary: "check config files (or ConfigMap manifests) as the agent would; exit 1 on a problem",
	about: `Parses and validates each FILE exactly as the agent would, and prints each
problem on one line as FILE:LINE: key: message (warnings end in "(warning)").
A FILE that is a ConfigMap manifest (kind: ConfigMap, or a kind: List that
holds one) is recognised: the value of its data key "config" (or of keys
named ip-masq...) is checked, with lines pointing into the manifest; a
ConfigMap without the key "config", the only one the shipped DaemonSet
mounts, is a warning, and so is one named other than the ConfigMap it
mounts (kube-system/ip-masq-agent). Manifests of other objects (a DaemonSet, a
kustomization) are passed over with a note, so a whole directory of
manifests can be given. A directory stands for its files named
ip-masq*, read as with --config DIR, with the meaning Azure's
ip-masq-agent-v2 gives them (only nonMasqueradeCIDRs, masqLinkLocal and
masqLinkLocalIPv6 are read, up to 64 CIDRs a file); what the agent warns
about the directory itself is reported too: a symlink to a missing file, a
subdirectory named ip-masq*, no ip-masq* file, and files that together
exempt no destination. "-" reads standard input.

Exit status: 0 when every file is valid (warnings alone are fine), 1 when
any file has an error or when no FILE held a config (nothing was checked),
2 on bad usage. --strict also fails on warnings (unknown keys, i.e. typos;
keys in another case; IPv4-mapped CIDRs; a resyncInterval below 1s; a
ConfigMap without the key "config", or not named kube-system/ip-masq-agent; a directory without files named
ip-masq*) and on CIDRs that have no effect: contained in, or equal to,
another of the same list, or a nonMasqueradeCIDRs entry inside a
masqueradeCIDRs entry (with cidrMatch: mostSpecific: an entry inside one of
its own list with no entry of the other list between them), and on
egressInterfaces entries another matches ("eth0" beside "eth*").

--masq-chain and --to-ports, when given, are checked as the agent takes
them, FILE or not: a chain name that nft cannot read back (it is spelled
otherwise here), one the original agent could never write (it ran with no
rules of its own; this agent runs with them), and ports reaching 0 are
warnings; a --to-ports the agent refuses is an error.`,
	// Run from the repository's root, it checks the example ConfigMap and
	// passes over the kustomization beside it (TestValidateExample).
	example: "ip-masq-agent validate --strict deploy/examples/*.yaml",
	run:     runValidate,
}

func runValidate(c *command, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("validate", flag.ContinueOnError)
	var r rulesetFlags
	r.registerValidation(fs)
	fs.StringVar(&r.masqChain, "masq-chain", nft.DefaultChain, "check this --masq-chain as the agent takes it")
	fs.StringVar(&r.toPorts, "to-ports", "", "check this --to-ports as the agent takes it")
	strict := fs.Bool("strict", false, "also fail on warnings (unknown keys, i.e. typos) and on CIDRs that have no effect (contained in others)")
	files, code, done := c.parse(fs, args, stdout, stderr)
	if done {
		return code
	}
	flagsGiven := false
	fs.Visit(func(f *flag.Flag) { flagsGiven = flagsGiven || f.Name == "masq-chain" || f.Name == "to-ports" })
	if len(files) == 0 && !flagsGiven {
		return usageError(c, stderr, "no FILE given")
	}
	var nFiles, nErrors, nWarnings int
	// The flags the original ran with, as the agent takes them.
	switch warnings, err := r.finish(); {
	case err != nil:
		fmt.Fprintln(stdout, err)
		nErrors++
	default:
		for _, w := range warnings {
			if *strict {
				fmt.Fprintln(stdout, w)
				nErrors++
				continue
			}
			fmt.Fprintln(stdout, w+" (warning)")
			nWarnings++
		}
	}
	for _, arg := range files {
		paths, warn := config.Files(arg)
		switch {
		case warn != "" && *strict:
			fmt.Fprintf(stdout, "%s: %s\n", arg, warn)
			nErrors++
		case warn != "":
			fmt.Fprintf(stdout, "%s: %s (warning)\n", arg, warn)
			nWarnings++
		}
		// A directory's files mean what Azure's ip-masq-agent-v2 makes of
		// them (as with --config DIR); its entries it cannot read and an
		// empty union are said once for the directory.
		flags := r.flags
		if config.KindOf(arg) == config.SourceDir && arg != "-" {
			flags.AzureDir = true
			for _, n := range config.DirNotes(arg, r.flags) {
				if *strict {
					fmt.Fprintln(stdout, n)
					nErrors++
					continue
				}
				fmt.Fprintln(stdout, n+" (warning)")
				nWarnings++
			}
		}
		for _, path := range paths {
			nFiles++
			data, err := config.ReadInput(path, os.Stdin)
			if err != nil {
				fmt.Fprintf(stdout, "%s: %v\n", path, err)
				nErrors++
				continue
			}
			if kinds := config.Kinds(data); len(kinds) > 0 && !slices.Contains(kinds, "ConfigMap") {
				fmt.Fprintf(stderr, "%s: not checked: a manifest of %s, not of a ConfigMap\n", path, strings.Join(kinds, ", "))
				nFiles--
				continue
			}
			for _, p := range config.Check(data, flags, *strict) {
				line := fmt.Sprintf("%s:%d: ", path, p.Line)
				if p.Key != "" {
					line += p.Key + ": "
				}
				line += p.Message
				if p.Warning {
					line += " (warning)"
					nWarnings++
				} else {
					nErrors++
				}
				fmt.Fprintln(stdout, line)
			}
		}
	}
	fmt.Fprintf(stderr, "%s checked: %s, %s\n", plural(nFiles, "file"), plural(nErrors, "error"), plural(nWarnings, "warning"))
	if nFiles == 0 && len(files) > 0 {
		// Passing when nothing was checked would pass a CI job that
		// globs the wrong files.
		fmt.Fprintln(stderr, "validate: nothing checked: no FILE holds an ip-masq-agent config (a config file, or a ConfigMap manifest)")
		return 1
	}
	if nErrors > 0 {
		return 1
	}
	return 0
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

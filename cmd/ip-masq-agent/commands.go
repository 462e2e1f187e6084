package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft/kernel"
	"github.com/ip-masq-agent/ip-masq-agent-nft/original"
	"github.com/ip-masq-agent/ip-masq-agent-nft/windows"
)

// command is one of the tools for operators: ip-masq-agent COMMAND ...
type command struct {
	name    string
	args    string // after "ip-masq-agent NAME"
	summary string // one line, for the list of commands
	about   string // paragraphs, for --help
	example string
	run     func(c *command, args []string, stdout, stderr io.Writer) int
}

var commands []*command

func init() {
	commands = []*command{
		{
			name: "validate", args: "[--strict] [--enable-ipv6] [--nomasq-all-reserved-ranges] FILE...",
			summary: "check config files (or ConfigMap manifests) as the agent would; exit 1 on a problem",
			about: `Parses and validates each FILE exactly as the agent would, and prints each
problem on one line as FILE:LINE: key: message (warnings end in "(warning)").
A FILE that is a ConfigMap manifest (kind: ConfigMap) is recognised: the
value of its data key "config" (or of keys named ip-masq...) is checked, with
lines pointing into the manifest; manifests of other objects (a DaemonSet, a
kustomization) are passed over with a note, so a whole directory of
manifests can be given. A directory stands for its files named
ip-masq*, as with --config DIR. "-" reads standard input.

Exit status: 0 when every file is valid (warnings alone are fine), 1 when
any file has an error, 2 on bad usage. --strict also fails on warnings
(unknown keys, i.e. typos; keys in another case; IPv4-mapped CIDRs; a
resyncInterval below 1s) and on CIDRs that have no effect: contained in, or
equal to, another of the same list, or a nonMasqueradeCIDRs entry inside a
masqueradeCIDRs entry.`,
			example: "ip-masq-agent validate --strict deploy/*.yaml",
			run:     runValidate,
		},
		{
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
		},
		{
			name: "explain", args: "[--config FILE|DIR] [--live] [flags] ADDRESS...",
			summary: "say whether traffic to each address is masqueraded, and which rule decides",
			about: `For each destination ADDRESS, says whether new connections from pods to it
are masqueraded, and why: the CIDR and the key it comes from (such as
"nonMasqueradeCIDRs[2] 10.0.0.0/8"), the link-local default, or the
outbound default, from the config and flags alone.

In the agent's pod (kubectl exec), the flags not given here are the running
agent's (--agent-pid), so the answer is for the config and flags in force.

--live also reads the kernel's current table inet ip-masq-agent (needs
CAP_NET_ADMIN, run it on the node, e.g. in the agent's pod) and evaluates
its rules as the kernel does, with the node's own addresses (never
masqueraded); it prints both answers and DISAGREE where they differ (then
"ip-masq-agent diff" says what differs). Exit status: 0; 1 when --live
found a disagreement; 2 on errors.`,
			example: "ip-masq-agent explain --config ip-masq-agent.yaml 10.0.0.1 169.254.169.254 203.0.113.10\n" +
				"  ip-masq-agent explain --live 10.96.0.10",
			run: runExplain,
		},
		{
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

Exit status: 0 and "in sync" when the table is what the agent would
program; 1 when it differs or is missing ("table inet ip-masq-agent
missing"); 2 on errors.`,
			example: "ip-masq-agent diff --config /etc/config/ip-masq-agent",
			run:     runDiff,
		},
		{
			name: "cleanup-iptables", args: "[--masq-chain NAME] [--watch DURATION]",
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
every rule carries the original's comments. A chain of those names that holds anything else is reported and
left alone; --masq-chain NAME removes the chain NAME (and the jumps to it)
whatever it holds. Nothing else is touched. The daemon does the same by
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
		},
		{
			name: "list", args: "",
			summary: "print the kernel's table inet ip-masq-agent in nft syntax, with counters and whether it is owned, orphaned or free",
			about: `Reads the kernel's table inet ip-masq-agent through the agent's own netlink
reader (needs CAP_NET_ADMIN: run it on the node, e.g. kubectl exec into the
agent's pod, where there is no nft) and prints it as nft list table would,
with each rule's counter. Whatever the table holds is shown, the agent's
or not; what the agent did not make is marked "not the agent's". The first
line says whether the table is owned (a running agent owns it), orphaned
(its owner exited; it persists) or free (not owned).
Exit status: 0; 1 when there is no table; 2 on errors.`,
			example: "ip-masq-agent list\n  kubectl -n kube-system exec $POD -- /ip-masq-agent list   # $POD: the agent's pod on the node (docs/runbook.md)",
			run:     runList,
		},
	}
}

// runCommand runs "ip-masq-agent NAME ARGS...".
func runCommand(name string, args []string, stdout, stderr io.Writer) int {
	if name == "help" {
		if len(args) == 0 {
			commandList(stdout)
			return 0
		}
		name, args = args[0], []string{"--help"}
	}
	for _, c := range commands {
		if c.name == name {
			return c.run(c, args, stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "ip-masq-agent: unknown command %q\n\n", name)
	commandList(stderr)
	return 2
}

func commandList(w io.Writer) {
	fmt.Fprintln(w, "Usage: ip-masq-agent [flags]             run the agent (the DaemonSet's command)")
	fmt.Fprintln(w, "       ip-masq-agent COMMAND [ARGS...]   a tool for operators")
	fmt.Fprintln(w, "\nCommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-16s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun \"ip-masq-agent COMMAND --help\" for a command's flags and an example,")
	fmt.Fprintln(w, "and \"ip-masq-agent --help\" for the agent's flags.")
}

// daemonUsage is the agent's --help: the flags that mean something, then
// the original agent's klog flags, accepted and ignored, by name only.
func daemonUsage(fs *flag.FlagSet) {
	w := fs.Output()
	fmt.Fprintln(w, "Usage: ip-masq-agent [flags]")
	fmt.Fprintln(w, "\nKeeps the node's table inet ip-masq-agent in line with the config file.")
	fmt.Fprintln(w, "\nExample:\n  ip-masq-agent --config /etc/config/ip-masq-agent --enable-ipv6")
	fmt.Fprintln(w, "\nTools: ip-masq-agent validate|render|explain|diff|list|cleanup-iptables ... (ip-masq-agent help)")
	fmt.Fprintln(w, "\nFlags:")
	real := flag.NewFlagSet(fs.Name(), flag.ContinueOnError)
	real.SetOutput(w)
	var ignored []string
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name != "v" && slices.Contains(klogFlagNames, f.Name) {
			ignored = append(ignored, "--"+f.Name)
			return
		}
		real.Var(f.Value, f.Name, f.Usage)
		real.Lookup(f.Name).DefValue = f.DefValue
	})
	real.PrintDefaults()
	fmt.Fprintln(w, "\nAccepted for the original agent's DaemonSet args, and ignored (klog's flags;")
	fmt.Fprintln(w, "logs always go to stderr; a warning at start names those given):")
	line := " "
	for _, name := range ignored {
		if len(line)+1+len(name) > 78 {
			fmt.Fprintln(w, line)
			line = " "
		}
		line += " " + name
	}
	fmt.Fprintln(w, line)
}

// parse parses a command's flags, which may come before, between or after
// its arguments ("--" ends the flags). --help prints the usage to stdout;
// done is true when the command is to exit with code.
func (c *command) parse(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) (pos []string, code int, done bool) {
	fs.SetOutput(stderr)
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "Usage: %s\n\n%s\n\nExample:\n  %s\n", strings.TrimSpace("ip-masq-agent "+c.name+" "+c.args), c.about, c.example)
		var n int
		fs.VisitAll(func(*flag.Flag) { n++ })
		if n > 0 {
			fmt.Fprintln(w, "\nFlags:")
			fs.PrintDefaults()
		}
	}
	for _, a := range args {
		if a == "--" {
			break
		}
		if a == "-h" || a == "-help" || a == "--help" || a == "--h" {
			fs.SetOutput(stdout)
		}
	}
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, 0, true
			}
			return nil, 2, true
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, 0, false
		}
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			return append(pos, rest...), 0, false
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
}

func usageError(c *command, stderr io.Writer, format string, a ...any) int {
	fmt.Fprintf(stderr, "ip-masq-agent %s: %s\n", c.name, fmt.Sprintf(format, a...))
	fmt.Fprintf(stderr, "Usage: ip-masq-agent %s %s (see --help)\n", c.name, c.args)
	return 2
}

func runValidate(c *command, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("validate", flag.ContinueOnError)
	var r rulesetFlags
	r.registerValidation(fs)
	strict := fs.Bool("strict", false, "also fail on warnings (unknown keys, i.e. typos) and on CIDRs that have no effect (contained in others)")
	files, code, done := c.parse(fs, args, stdout, stderr)
	if done {
		return code
	}
	if len(files) == 0 {
		return usageError(c, stderr, "no FILE given")
	}
	var nFiles, nErrors, nWarnings int
	for _, arg := range files {
		paths, warn := configFiles(arg)
		if warn != "" {
			fmt.Fprintf(stdout, "%s: %s (warning)\n", arg, warn)
			nWarnings++
		}
		for _, path := range paths {
			nFiles++
			data, err := readInput(path, os.Stdin)
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
			for _, p := range config.Check(data, r.flags, *strict) {
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

// configFiles returns the files an argument of validate stands for: itself,
// or a directory's files named ip-masq*, as the agent reads them.
func configFiles(arg string) ([]string, string) {
	fi, err := os.Stat(arg)
	if err != nil || !fi.IsDir() {
		return []string{arg}, ""
	}
	entries, err := os.ReadDir(arg)
	if err != nil {
		return []string{arg}, ""
	}
	var out []string
	for _, e := range entries {
		path := filepath.Join(arg, e.Name())
		if fi, err := os.Stat(path); config.IsConfigName(e.Name()) && err == nil && !fi.IsDir() {
			out = append(out, path)
		}
	}
	if len(out) == 0 {
		return nil, `a directory without files named ip-masq*: the agent would use the defaults`
	}
	return out, ""
}

// readInput reads a file, or stdin for "-", up to config.MaxFileSize.
func readInput(path string, stdin io.Reader) ([]byte, error) {
	var r io.Reader = stdin
	if path != "-" || stdin == nil {
		f, err := os.Open(path)
		if err != nil {
			var pe *fs.PathError
			if errors.As(err, &pe) {
				return nil, fmt.Errorf("cannot %s: %w", pe.Op, pe.Err)
			}
			return nil, err
		}
		defer f.Close()
		if fi, err := f.Stat(); err == nil && fi.IsDir() {
			return nil, errors.New("is a directory")
		}
		r = f
	}
	data, err := io.ReadAll(io.LimitReader(r, config.MaxFileSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > config.MaxFileSize {
		return nil, fmt.Errorf("larger than the limit of %d bytes", config.MaxFileSize)
	}
	return data, nil
}

// loadConfig reads --config for a tool exactly as the daemon reads it
// (config.Loader decides what the path is; a ConfigMap manifest is read
// as the file it holds). Unlike the daemon, a tool fails on any bad file
// of a directory (it has no last good content to fall back on).
func loadConfig(path string, f config.Flags, stderr io.Writer) (config.Config, error) {
	cfg, warns, err := (&config.Loader{}).Load(path, f)
	for _, w := range warns {
		fmt.Fprintln(stderr, "warning: "+w)
	}
	return cfg, err
}

// rulesetCommand parses a command's flags (the daemon's ruleset flags and
// extra) and loads the config. The ruleset flags that the command line does
// not give are the running agent's (--agent-pid): in the agent's pod, a
// tool answers for the agent's own config and flags, with nothing retyped.
func rulesetCommand(c *command, fs *flag.FlagSet, args []string, stdout, stderr io.Writer) (r rulesetFlags, cfg config.Config, pos []string, code int, done bool) {
	r.register(fs)
	agentPID := fs.String("agent-pid", "auto", "take the flags --config, --enable-ipv6, --masq-chain, ... that are not given here from the running agent's command line (/proc/PID/cmdline): auto (process 1 when it is the agent, as in the agent's pod), a PID, or none")
	pos, code, done = c.parse(fs, args, stdout, stderr)
	if done {
		return
	}
	if err := adoptAgentFlags(fs, *agentPID, stderr); err != nil {
		return r, cfg, pos, usageError(c, stderr, "%v", err), true
	}
	if err := r.finish(); err != nil {
		return r, cfg, pos, usageError(c, stderr, "%v", err), true
	}
	var err error
	if cfg, err = loadConfig(r.configPath, r.flags, stderr); err != nil {
		fmt.Fprintf(stderr, "ip-masq-agent %s: %v\n", c.name, err)
		return r, cfg, pos, 2, true
	}
	return r, cfg, pos, 0, false
}

// procCmdline reads a process's argv (tests replace it).
var procCmdline = func(pid int) ([]string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil, err
	}
	return strings.Split(strings.TrimSuffix(string(data), "\x00"), "\x00"), nil
}

// adoptAgentFlags sets the ruleset flags of fs that the command line did
// not give to the running agent's (the daemon's) values, and says so on
// stderr. spec is --agent-pid: "auto" (process 1 if it is the agent daemon,
// else nothing), "none", or a PID (which must be the agent daemon).
func adoptAgentFlags(fs *flag.FlagSet, spec string, stderr io.Writer) error {
	pid := 1
	switch spec {
	case "none":
		return nil
	case "auto":
		if os.Getpid() == 1 {
			return nil
		}
	default:
		n, err := strconv.Atoi(spec)
		if err != nil || n <= 0 {
			return fmt.Errorf("--agent-pid %q: want auto, none or a process ID", spec)
		}
		pid = n
	}
	argv, err := procCmdline(pid)
	isAgent := err == nil && len(argv) > 0 && filepath.Base(argv[0]) == "ip-masq-agent" &&
		(len(argv) == 1 || strings.HasPrefix(argv[1], "-"))
	if !isAgent {
		if spec == "auto" {
			return nil
		}
		if err != nil {
			return fmt.Errorf("--agent-pid %d: %v", pid, err)
		}
		return fmt.Errorf("--agent-pid %d: not the ip-masq-agent daemon: %q", pid, argv)
	}
	d, _, done := parseDaemonFlags(argv[1:], io.Discard, io.Discard)
	if done {
		return fmt.Errorf("cannot read the running agent's flags (pid %d): %q", pid, argv[1:])
	}
	var names rulesetFlags
	ruleset := flag.NewFlagSet("", flag.ContinueOnError)
	names.register(ruleset)
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var adopted []string
	d.visit(func(f *flag.Flag) {
		if ruleset.Lookup(f.Name) == nil || given[f.Name] || fs.Lookup(f.Name) == nil {
			return
		}
		if fs.Set(f.Name, f.Value.String()) == nil {
			adopted = append(adopted, "--"+f.Name+"="+f.Value.String())
		}
	})
	if len(adopted) == 0 {
		adopted = []string{"(only defaults)"}
	}
	fmt.Fprintf(stderr, "note: with the running agent's flags (pid %d): %s\n", pid, strings.Join(adopted, " "))
	return nil
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

func runExplain(c *command, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("explain", flag.ContinueOnError)
	live := fs.Bool("live", false, "also evaluate the kernel's current table (CAP_NET_ADMIN) and say where it disagrees")
	r, cfg, pos, code, done := rulesetCommand(c, fs, args, stdout, stderr)
	if done {
		return code
	}
	if len(pos) == 0 {
		return usageError(c, stderr, "no ADDRESS given")
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
			e := nft.Explain(cfg, r.nft, a)
			fmt.Fprintf(stdout, "%-*s  %-15s  %s\n", width, a, e.Verdict(), e.Reason)
		}
		return 0
	}
	table, err := readTable()
	if err != nil {
		fmt.Fprintf(stderr, "ip-masq-agent explain --live: %v\n", hint(err))
		return 2
	}
	original, oerr := readOriginal("")
	if oerr != nil {
		fmt.Fprintf(stderr, "ip-masq-agent explain --live: cannot look for the original agent's iptables rules: %v\n", hint(oerr))
	}
	local := localAddrs()
	disagree := 0
	for _, a := range addrs {
		want := nft.Explain(cfg, r.nft, a)
		got := nft.Explanation{Addr: want.Addr, Reason: "table inet " + nft.TableName + " does not exist: nothing is masqueraded by it"}
		if table != nil {
			got = nft.ExplainTable(table, a, local)
		}
		// The original agent's jump, in iptables' nat POSTROUTING, runs first.
		if first, decided := original.ExplainOriginal(a, local(a)); decided {
			got = first
		} else if first.Reason != "" {
			got.Reason = first.Reason + "; then " + got.Reason
		}
		fmt.Fprintf(stdout, "%s\n  config: %s: %s\n  kernel: %s: %s\n", a, want.Verdict(), want.Reason, got.Verdict(), got.Reason)
		if got.Rule != "" {
			fmt.Fprintf(stdout, "          rule: %s\n", got.Rule)
		}
		switch {
		case got.Undetermined || got.Masquerade != want.Masquerade:
			if local(want.Addr) && !got.Masquerade && !got.Undetermined {
				fmt.Fprintln(stdout, "  (the address is the node's own: the kernel never masquerades it, whatever the config)")
				continue
			}
			disagree++
			fmt.Fprintln(stdout, "  DISAGREE: the kernel's table does not do what the config says (see ip-masq-agent diff)")
		}
	}
	if disagree > 0 {
		return 1
	}
	return 0
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

func runDiff(c *command, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("diff", flag.ContinueOnError)
	r, cfg, pos, code, done := rulesetCommand(c, fs, args, stdout, stderr)
	if done {
		return code
	}
	table, code, ok := liveTable(c, pos, stderr)
	if !ok {
		return code
	}
	// The original agent's jump, when there, decides before this table.
	original := 0
	if o, err := readOriginal(""); err != nil {
		fmt.Fprintf(stderr, "ip-masq-agent diff: cannot look for the original agent's iptables rules: %v\n", hint(err))
	} else {
		original = printOriginal(stdout, o)
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

// readOriginal reads the original agent's rules once: found by what they
// are, whatever --masq-chain the original ran with (chain: also by name).
func readOriginal(chain string) (original.Rules, error) {
	n := &kernel.Netlink{}
	defer n.Close()
	return original.Netlink{K: n}.FindOriginal(chain)
}

func runCleanupIptables(c *command, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("cleanup-iptables", flag.ContinueOnError)
	chain := fs.String("masq-chain", "", "also remove this chain (and the jumps to it) whatever it holds; the original's chains are found without it")
	watch := fs.Duration("watch", 3*time.Second, "watch the chain this long before removing it, to tell whether the original agent still rewrites it (0: do not watch)")
	agentPID := fs.String("agent-pid", "auto", "take --masq-chain, when not given, from the running agent's command line: auto (process 1 when it is the agent, as in its pod), a PID, or none")
	pos, code, done := c.parse(fs, args, stdout, stderr)
	if done {
		return code
	}
	if err := adoptAgentFlags(fs, *agentPID, stderr); err != nil {
		return usageError(c, stderr, "%v", err)
	}
	if len(pos) > 0 {
		return usageError(c, stderr, "unexpected arguments: %s", strings.Join(pos, " "))
	}
	if *watch < 0 {
		return usageError(c, stderr, "--watch %s: want 0 or more", *watch)
	}
	n := &kernel.Netlink{}
	defer n.Close()
	k := original.Netlink{K: n}
	o, err := k.FindOriginal(*chain)
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
		if *chain != "" {
			what += " and no chain " + *chain
		}
		fmt.Fprintf(stdout, "%s in table ip nat or ip6 nat: nothing to remove\n", what)
		return 0
	}
	fmt.Fprintf(stdout, "found the original ip-masq-agent's chain %s (the --masq-chain it ran with)\n", strings.Join(o.RemovableChains(), ", "))
	alive := false
	if *watch > 0 {
		time.Sleep(*watch)
		again, err := k.FindOriginal(*chain)
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
	removed, err := k.RemoveOriginal(*chain, o.Fingerprint())
	if errors.Is(err, original.ErrChanged) {
		alive = true
		removed, err = k.RemoveOriginal(*chain, "")
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

// liveTable reads the kernel's table for a command that takes no other
// arguments; when ok is false, code is the command's exit code.
func liveTable(c *command, pos []string, stderr io.Writer) (t *nft.Table, code int, ok bool) {
	if len(pos) > 0 {
		return nil, usageError(c, stderr, "unexpected arguments: %s", strings.Join(pos, " ")), false
	}
	t, err := readTable()
	if err != nil {
		fmt.Fprintf(stderr, "ip-masq-agent %s: %v\n", c.name, hint(err))
		return nil, 2, false
	}
	return t, 0, true
}

// readTable reads the kernel's table once (nil: there is none).
func readTable() (*nft.Table, error) {
	k := &kernel.Netlink{}
	defer k.Close()
	return k.ReadAll()
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
			"nft 1.0.6 lists it with a bare \"flags \" line that nft -f refuses; save rulesets without it, or run the agent with --release-on-exit (docs/upgrade.md)"
	}
	return "# free: not owned (--own-table=false, --release-on-exit after exit, or a kernel before 6.9): any process may change it"
}

package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/agent"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft/kernel"
	"github.com/ip-masq-agent/ip-masq-agent-nft/original"
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

// commands are the tools, in the order help lists them; each is in a file
// of its own.
var commands = []*command{validateCommand, renderCommand, explainCommand, diffCommand, cleanupIptablesCommand, listCommand}

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
	r, cfg, pos, cfgErr, code, done := rulesetCommandBadConfig(c, fs, args, stdout, stderr)
	if !done && cfgErr != nil {
		fmt.Fprintf(stderr, "ip-masq-agent %s: %v\n", c.name, cfgErr)
		return r, cfg, pos, 2, true
	}
	return r, cfg, pos, code, done
}

// rulesetCommandBadConfig is rulesetCommand for the commands that still
// answer from the kernel when the config is bad (explain --live, diff):
// the config's error is returned, not printed.
func rulesetCommandBadConfig(c *command, fs *flag.FlagSet, args []string, stdout, stderr io.Writer) (r rulesetFlags, cfg config.Config, pos []string, cfgErr error, code int, done bool) {
	r.register(fs)
	agentPID := fs.String("agent-pid", "auto", "take the flags --config, --enable-ipv6, --masq-chain, ... that are not given here from the running agent's command line (/proc/PID/cmdline): auto (process 1 when it is the agent, as in the agent's pod), a PID, or none")
	pos, code, done = c.parse(fs, args, stdout, stderr)
	if done {
		return
	}
	if err := adoptAgentFlags(fs, *agentPID, stderr); err != nil {
		return r, cfg, pos, nil, usageError(c, stderr, "%v", err), true
	}
	warnings, err := r.finish()
	if err != nil {
		return r, cfg, pos, nil, usageError(c, stderr, "%v", err), true
	}
	for _, w := range warnings {
		fmt.Fprintf(stderr, "warning: %s\n", w)
	}
	cfg, cfgErr = loadConfig(r.configPath, r.flags, stderr)
	return r, cfg, pos, cfgErr, 0, false
}

// exitBadConfig is the exit status of explain --live and diff when the
// config is bad: they said so and answered from the kernel all the same.
const exitBadConfig = 3

// badConfigLine is the one line that says the config is bad, with the
// agent's words ("config not applied") and what the kernel keeps.
func badConfigLine(err error) string {
	return "config not applied: " + err.Error() + "; the agent keeps the kernel's table as it is (the last good config's, or none)"
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
	d, pid, found, err := runningAgent(spec)
	if err != nil || !found {
		return err
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

// runningAgent is the running agent daemon's command line, as
// adoptAgentFlags finds it (spec: --agent-pid); found is false when there
// is none to take it from.
func runningAgent(spec string) (d daemonFlags, pid int, found bool, err error) {
	pid = 1
	switch spec {
	case "none":
		return d, 0, false, nil
	case "auto":
		if os.Getpid() == 1 {
			return d, 0, false, nil
		}
	default:
		n, err := strconv.Atoi(spec)
		if err != nil || n <= 0 {
			return d, 0, false, fmt.Errorf("--agent-pid %q: want auto, none or a process ID", spec)
		}
		pid = n
	}
	argv, err := procCmdline(pid)
	isAgent := err == nil && len(argv) > 0 && filepath.Base(argv[0]) == "ip-masq-agent" &&
		(len(argv) == 1 || strings.HasPrefix(argv[1], "-"))
	if !isAgent {
		if spec == "auto" {
			return d, pid, false, nil
		}
		if err != nil {
			return d, pid, false, fmt.Errorf("--agent-pid %d: %v", pid, err)
		}
		return d, pid, false, fmt.Errorf("--agent-pid %d: not the ip-masq-agent daemon: %q", pid, argv)
	}
	d, _, done := parseDaemonFlags(argv[1:], io.Discard, io.Discard)
	if done {
		return d, pid, false, fmt.Errorf("cannot read the running agent's flags (pid %d): %q", pid, argv[1:])
	}
	return d, pid, true, nil
}

// readOriginal reads the original agent's rules once: found by what they
// are, whatever --masq-chain the original ran with (chain: also by name).
func readOriginal(chain string) (original.Rules, error) {
	n := &kernel.Netlink{}
	defer n.Close()
	return original.Netlink{K: n}.FindOriginal(chain)
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

// hint adds what an operator needs to know to the errors that need it.
func hint(err error) error { return agent.Hint(err) }

// asBuilt returns o as the agent built table t from cfg: with adjacent
// CIDRs joined (nft.Options.MergeAdjacent; the agent joins them on a
// kernel whose interval lookup is the array's) when that build is the
// closer to t, so that diff and explain --live compare with the layout the
// agent writes on this kernel, not with the other one. A table out of sync
// may be closer to the other layout than the agent's: then diff shows the
// changes in that layout (the same decisions).
func asBuilt(t *nft.Table, cfg config.Config, o nft.Options) nft.Options {
	j := o
	j.MergeAdjacent = true
	if t == nil || t.HasAdjacent() || !nft.Build(cfg, o).HasAdjacent() {
		return o // the agent never writes adjacent ranges joined; or nothing to join
	}
	size := func(p nft.Plan) (n int) {
		for _, op := range p.Ops {
			n += 1 + len(op.Elements)
		}
		return n
	}
	if size(nft.DiffPlan(t, nft.Build(cfg, j))) < size(nft.DiffPlan(t, nft.Build(cfg, o))) {
		return j
	}
	return o
}

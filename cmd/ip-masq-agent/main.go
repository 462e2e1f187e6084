// Command ip-masq-agent keeps a node's nftables masquerade rules in line
// with the ip-masq-agent ConfigMap. See README.md.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/ip-masq-agent/ip-masq-agent-nft/conntrack"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/metrics"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// options are the parsed command line.
type options struct {
	rulesetFlags // --config and the flags that shape the ruleset (flags.go)
	once         bool
	ownTable     bool
	release      bool
	conntrack    conntrack.Mode
	cleanup      bool
	httpAddr     string
}

// daemonFlags are the daemon's parsed command line.
type daemonFlags struct {
	options
	logFormat, logLevel string
	logFlags            logFlags               // the original agent's klog flags (flags.go)
	logIgnored          string                 // the warning about those that have no effect, if any
	resyncWarning       string                 // the warning about a --resync-interval below 1 s, if any
	warnings            []string               // what the flags mean here where that may surprise (flags.go's finish, ignoredArgs)
	visit               func(func(*flag.Flag)) // the flags given, for the start line
}

// parseDaemonFlags parses the daemon's flags. --help and --version write
// to stdout; done is true when the agent is to exit with code.
func parseDaemonFlags(args []string, stdout, stderr io.Writer) (d daemonFlags, code int, done bool) {
	fs := flag.NewFlagSet("ip-masq-agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { daemonUsage(fs) }
	o := &d.options
	var showVersion bool
	// The original agent's flags, with its defaults.
	o.register(fs)
	// New in this agent.
	fs.BoolVar(&o.once, "once", false, "apply the config once and exit: 0 on success, 1 on error")
	fs.BoolVar(&o.cleanup, "cleanup", false, "delete the agent's table inet "+nft.TableName+" and exit (refused while a running agent owns it)")
	o.conntrack = conntrack.DefaultMode
	fs.Var(&o.conntrack, "conntrack-cleanup", "after a change of decisions, delete the conntrack entries that keep the old one: udp (default), all (also breaks established TCP to the changed ranges) or none")
	fs.BoolVar(&o.ownTable, "own-table", true, "own the table (Linux 6.9+): while the agent runs no other process can change it; false: verify and repair only")
	fs.StringVar(&o.httpAddr, "http-address", metrics.DefaultAddress, "where to serve /metrics, /healthz and /readyz (HOST:PORT; the DaemonSet's probes need it, so it cannot be empty; :9753 or NODE_IP:9753 to let Prometheus scrape it)")
	fs.BoolVar(&o.release, "release-on-exit", true, "at exit (SIGTERM, SIGINT, the end of --once), re-create the owned table unowned and not persistent in one transaction, its rules in force throughout, so that saved rulesets (nft list ruleset) load with nft -f; false: leave it orphaned (flags persist)")
	fs.StringVar(&d.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&d.logLevel, "log-level", "", "log level: debug, info, warn or error (overrides --v)")
	fs.BoolVar(&showVersion, "version", false, "print the version and exit")
	// The original agent's logging flags (klog's), -v among them.
	d.logFlags.register(fs)
	// Azure/ip-masq-agent-v2's own flag (its others are the original's).
	resync := fs.Int("resync-interval", 60, "Azure ip-masq-agent-v2's flag: the resync interval in seconds of a config that sets no resyncInterval")
	// A parse error goes to stderr with the usage; --help to stdout alone.
	help := false
	fs.Usage = func() {
		if !help {
			daemonUsage(fs)
		}
	}
	for _, a := range args {
		if a == "--" {
			break
		}
		if a == "-h" || a == "--h" || a == "-help" || a == "--help" {
			help = true
		}
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stdout)
			daemonUsage(fs)
			return d, 0, true
		}
		return d, 2, true
	}
	if fs.NArg() > 0 {
		// The original agent's flag.Parse stopped at the first word that
		// is no flag, and it ran with the flags before it: the rest of the
		// command line had no effect ("--enable-ipv6 true" is --enable-ipv6).
		d.warnings = append(d.warnings, ignoredArgs(fs, args))
	}
	if showVersion {
		fmt.Fprintln(stdout, "ip-masq-agent", version)
		return d, 0, true
	}
	d.logIgnored = d.logFlags.ignored(fs)
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if given["resync-interval"] {
		o.flags.ResyncInterval, d.resyncWarning = resyncSeconds(*resync)
		if !given["random-fully"] {
			// An Azure ip-masq-agent-v2 command line: its MASQUERADE rule
			// had no --random-fully.
			d.resyncWarning = strings.TrimPrefix(d.resyncWarning+"; ", "; ") + "--resync-interval is Azure ip-masq-agent-v2's flag, whose agent masqueraded without fully-random source ports; " +
				"this agent masquerades with them (the kubernetes-sigs agent's default) unless --random-fully=false"
		}
	}
	warnings, err := o.finish()
	if err != nil {
		fmt.Fprintf(stderr, "ip-masq-agent: %v\n", err)
		return d, 2, true
	}
	d.warnings = append(d.warnings, warnings...)
	// The probes of the shipped DaemonSet need /healthz and /readyz: an
	// agent without the endpoint would be restarted forever. (--once and
	// --cleanup serve nothing.)
	if o.httpAddr == "" && !o.once && !o.cleanup {
		fmt.Fprintf(stderr, "ip-masq-agent: --http-address is empty, but the DaemonSet's liveness and readiness probes need /healthz and /readyz there; keep the default %s (the node's loopback only), or give 127.0.0.1:0 for a port of no use to anyone\n", metrics.DefaultAddress)
		return d, 2, true
	}
	d.visit = fs.Visit
	return d, 0, false
}

func run(args []string, stdout, stderr io.Writer) int {
	// ip-masq-agent COMMAND ...: the tools (commands.go, and a file a
	// command); without a command, the daemon (daemon.go).
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		return runCommand(args[0], args[1:], stdout, stderr)
	}
	d, code, done := parseDaemonFlags(args, stdout, stderr)
	if done {
		return code
	}
	return runDaemon(d, stderr)
}

// Command ip-masq-agent keeps a node's nftables masquerade rules in line
// with the ip-masq-agent ConfigMap. See README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/conntrack"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/agent"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/filewatch"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/metrics"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft/kernel"
	"github.com/ip-masq-agent/ip-masq-agent-nft/original"
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
	fs.BoolVar(&o.release, "release-on-exit", false, "at exit, leave the table unowned and not persistent (one transaction) rather than orphaned, so that saved rulesets (nft list ruleset) load with nft -f; --once then never owns it")
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
		fmt.Fprintf(stderr, "ip-masq-agent: unexpected arguments: %s\n", strings.Join(fs.Args(), " "))
		return d, 2, true
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
	if err := o.finish(); err != nil {
		fmt.Fprintf(stderr, "ip-masq-agent: %v\n", err)
		return d, 2, true
	}
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
	// ip-masq-agent COMMAND ...: the tools (commands.go); without a
	// command, the daemon.
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		return runCommand(args[0], args[1:], stdout, stderr)
	}
	d, code, done := parseDaemonFlags(args, stdout, stderr)
	if done {
		return code
	}
	o := d.options
	log, err := newLogger(stderr, d.logFormat, d.logLevel, int(d.logFlags.v))
	if err != nil {
		fmt.Fprintf(stderr, "ip-masq-agent: %v\n", err)
		return 2
	}

	// The version, the config source and the flags that differ from
	// their defaults: one short line.
	attrs := []any{"version", version, "config", config.KindOf(o.configPath).String() + " " + o.configPath}
	d.visit(func(f *flag.Flag) {
		if f.Name != "version" && f.Name != "config" && f.Value.String() != f.DefValue {
			attrs = append(attrs, f.Name, f.Value.String())
		}
	})
	log.Info("starting ip-masq-agent", attrs...)
	if d.logIgnored != "" {
		log.Warn(d.logIgnored)
	}
	if d.resyncWarning != "" {
		log.Warn(d.resyncWarning)
	}

	slog.SetDefault(log)
	// --once --release-on-exit: no owner to release; the table is written unowned.
	k := &kernel.Netlink{NoOwner: !o.ownTable || (o.once && o.release)}
	defer k.Close()
	m := metrics.New(version, func() ([]metrics.RuleCounter, error) {
		cs, err := k.DecisionCounters(o.nft.Chain)
		out := make([]metrics.RuleCounter, len(cs))
		for i, c := range cs {
			out[i] = metrics.RuleCounter(c)
		}
		return out, err
	})
	// The daemon also watches nftables notifications: a change by another
	// process (possible when the table is not owned) is verified and
	// repaired at once rather than at the next resync.
	ao := agent.Options{ConfigPath: o.configPath, Flags: o.flags, NFT: o.nft, Watch: !o.once, Original: original.Netlink{K: k}}
	if o.conntrack != conntrack.ModeNone && o.nft.CtLabel == nil {
		log.Warn("conntrack cleanup without a mark (--conntrack-label=none): a change from masquerade to no masquerade also deletes the entries that another component (kube-proxy, a CNI) masqueraded to a node address", "mode", o.conntrack)
	}
	if o.conntrack != conntrack.ModeNone {
		ao.Applied = func(old, new nft.Table) { cleanConntrack(o.conntrack, old, new, log, m) }
	}
	ag := agent.New(ao, k, log, m)
	switch {
	case o.cleanup:
		// Say which happened: read first (Delete does nothing without a table).
		if t, _, err := k.Read(); err == nil && t == nil {
			log.Info("there is no table inet " + nft.TableName + ": nothing to delete")
			return 0
		}
		if err := k.Delete(); err != nil {
			if errors.Is(err, nft.ErrOwnedByOther) {
				log.Error("cleanup refused: a running agent owns the table and would put it back; delete its DaemonSet (or stop it) first", "err", err)
			} else {
				log.Error("cleanup failed", "err", agent.Hint(err))
			}
			return 1
		}
		log.Info("deleted table inet " + nft.TableName)
		return 0
	case o.once:
		if err := ag.Sync(time.Now()); err != nil {
			if errors.Is(err, nft.ErrOwnedByOther) {
				log.Error("not applied", "err", err)
			}
			return 1
		}
		return 0
	}
	// Without CAP_NET_ADMIN nothing will ever work: fail at start with one
	// line rather than retry forever. (EPERM alone does not tell: a table
	// owned by another process's socket is refused with EPERM too.)
	if !hasCapNetAdmin() {
		log.Error("cannot program nftables", "err", agent.Hint(syscall.EPERM))
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	served := make(chan error, 1)
	go func() { served <- metrics.Serve(ctx, o.httpAddr, m.Handler(), log) }()
	fileChanged := watchConfig(ctx, o.configPath, log)
	loopDone := make(chan struct{})
	go func() { ag.Run(ctx, fileChanged); close(loopDone) }()
	if err := <-served; err != nil {
		log.Error("cannot serve --http-address", "err", err)
		stop()
		<-loopDone
		return 1
	}
	<-ctx.Done()
	select {
	case <-loopDone:
	case <-time.After(stopTimeout):
		// A netlink request the kernel is slow to answer (a huge foreign
		// set, say) is not interrupted: exit without it.
		log.Warn("the loop did not stop in time (a netlink request is slow); exiting anyway", "waited", stopTimeout)
	}
	// The rules stay: masquerade must survive a restart or a rolling update.
	if o.release {
		select {
		case <-loopDone:
			// The table, re-created unowned in one transaction: no
			// moment without it.
			switch released, err := k.Release(); {
			case err != nil:
				log.Error("cannot release the table at exit; it stays owned until this process exits, then orphaned", "err", agent.Hint(err))
			case released:
				log.Info("released table inet " + nft.TableName + ": it stays in place, unowned and not persistent")
			}
		default: // the loop still holds the socket's lock: exit without it
		}
	}
	log.Info("stopping; the rules stay in place")
	return 0
}

// stopTimeout bounds the wait for the loop after SIGTERM, well within the
// kubelet's default grace period of 30 s.
const stopTimeout = 10 * time.Second

// cleanConntrack deletes the conntrack entries whose decision the new
// table made wrong; it runs after the new rules are in force.
//
// old is what the kernel held before (an empty table when there was none:
// nothing masqueraded). When old's masquerade rules marked the connections
// they masqueraded (--conntrack-label), only marked entries are undone;
// otherwise (no table before, an agent without the mark, a foreign rule
// in its masquerade chain, --conntrack-label=none) every entry
// masqueraded to a node address counts as the agent's, and the cleanup's
// log line says so (marked=false).
func cleanConntrack(mode conntrack.Mode, old, new nft.Table, log *slog.Logger, m *metrics.Agent) {
	mark := old.MarkLabel()
	res, err := conntrack.CleanupMarked(netns.None(), mode, old.Decider(), new.Decider(), mark)
	m.ConntrackDeleted(res.Deleted)
	attrs := []any{"mode", mode, "marked", mark >= 0}
	if mark >= 0 {
		attrs = append(attrs, "label", mark)
	}
	if err != nil {
		log.Error("conntrack cleanup failed; running flows keep their old decision", append(attrs, "err", err)...)
		return
	}
	if res.Deleted > 0 || res.Failed > 0 {
		log.Info("conntrack cleanup: "+res.String(), attrs...)
	} else {
		log.Debug("conntrack cleanup: "+res.String(), attrs...)
	}
}

// debounce coalesces a burst of file events (the kubelet's ..data swap is
// several) into one reload.
const debounce = 10 * time.Millisecond

// watchConfig returns a channel that receives after every change of the
// config file, or of the files of a config directory.
func watchConfig(ctx context.Context, path string, log *slog.Logger) <-chan struct{} {
	onError := func(err error) { log.Warn("watching the config file", "err", err) }
	var ch <-chan struct{}
	var err error
	switch config.KindOf(path) {
	case config.SourceNone:
		return nil
	case config.SourceDir:
		// A directory of files (a projected volume of ConfigMaps): config.Loader merges them.
		ch, err = filewatch.WatchDir(ctx, path, config.IsConfigName, debounce, onError)
	default:
		ch, err = filewatch.Watch(ctx, path, debounce, onError)
	}
	if err != nil {
		// The periodic resync still picks changes up.
		log.Error("cannot watch the config file; relying on the resync interval", "err", err)
	}
	return ch
}

func newLogger(w io.Writer, format, level string, verbosity int) (*slog.Logger, error) {
	lvl := slog.LevelInfo
	if verbosity >= 2 {
		lvl = slog.LevelDebug
	}
	if level != "" {
		if err := lvl.UnmarshalText([]byte(level)); err != nil {
			return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
		}
	}
	ho := &slog.HandlerOptions{Level: lvl}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, ho)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, ho)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

// hint adds what an operator needs to know to the errors that need it.
func hint(err error) error { return agent.Hint(err) }

// hasCapNetAdmin reports whether CAP_NET_ADMIN is in the effective set.
func hasCapNetAdmin() bool {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return true // cannot tell: let the kernel decide
	}
	for _, line := range strings.Split(string(status), "\n") {
		if hex, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			return err != nil || caps&(1<<unix.CAP_NET_ADMIN) != 0
		}
	}
	return true
}

package main

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// rulesetFlags are the original agent's flags, which decide the ruleset:
// the daemon and the render, explain and diff commands share them, so
// that a command sees exactly what the daemon would program.
type rulesetFlags struct {
	configPath string
	flags      config.Flags
	nft        nft.Options
	toPorts    string
	masqChain  string // --masq-chain as given; nft.Chain is the chain's name here (nft.ChainName)
}

// register defines the flags on fs, with the original agent's defaults.
func (r *rulesetFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&r.configPath, "config", config.DefaultPath,
		"config file (YAML or JSON), or a directory whose files named ip-masq* are merged; missing means defaults")
	r.registerValidation(fs)
	fs.BoolVar(&r.nft.RandomFully, "random-fully", true, "whether to masquerade with fully-random source ports")
	fs.StringVar(&r.toPorts, "to-ports", "", `masquerade to these source ports only, e.g. "1024-29999,32768-65535"; applies to tcp, udp and sctp`)
	fs.StringVar(&r.masqChain, "masq-chain", nft.DefaultChain, "name of the nft chain that holds the masquerade decisions (a name nft cannot read back, or one of the agent's own chains, is spelled differently: a warning says how)")
	r.nft.CtLabel = labelFlag{&r.nft.CtLabel}.defaultBit()
	fs.Var(labelFlag{&r.nft.CtLabel}, "conntrack-label",
		"conntrack label bit (0-127) set on the connections the agent masquerades, so that the conntrack cleanup undoes only its own masquerade; none: no mark (the cleanup then takes every masquerade to a node address for the agent's)")
}

// labelFlag is --conntrack-label: a label bit 0-127, or "none" (or -1).
type labelFlag struct{ p **uint8 }

func (labelFlag) defaultBit() *uint8 { b := uint8(nft.DefaultConntrackLabel); return &b }

func (l labelFlag) String() string {
	if l.p == nil || *l.p == nil {
		return "none"
	}
	return strconv.Itoa(int(**l.p))
}

func (l labelFlag) Set(s string) error {
	s = strings.TrimSpace(s)
	if strings.EqualFold(s, "none") || s == "-1" {
		*l.p = nil
		return nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > 127 {
		return fmt.Errorf("--conntrack-label %q: want a label bit 0-127, or none", s)
	}
	b := uint8(n)
	*l.p = &b
	return nil
}

// registerValidation defines the flags that change what a config means
// and whether it is valid (validate takes only these).
func (r *rulesetFlags) registerValidation(fs *flag.FlagSet) {
	fs.BoolVar(&r.flags.NoMasqAllReservedRanges, "nomasq-all-reserved-ranges", false,
		"whether to disable masquerade for all IPv4 ranges reserved by RFCs (default nonMasqueradeCIDRs only)")
	fs.BoolVar(&r.flags.EnableIPv6, "enable-ipv6", false, "whether to enable IPv6 (rules and IPv6 CIDRs)")
}

// finish checks and completes the flags after parsing. Every --masq-chain
// and every --to-ports the original agent ran with is taken (the original
// never exited on them); warnings say what an input means here when that
// may surprise: a chain named otherwise than the flag, a chain the
// original could never write, a port range that reaches port 0.
func (r *rulesetFlags) finish() (warnings []string, err error) {
	name, why := nft.ChainName(r.masqChain)
	r.nft.Chain = name
	r.nft.Links = nodeLinks
	if why != "" {
		warnings = append(warnings, fmt.Sprintf("--masq-chain=%q: the decision chain is named %s in table inet %s, because %s; "+
			"the name decides nothing, the decisions are the same", r.masqChain, name, nft.TableName, why))
	}
	if why := nft.OriginalCannotWrite(r.masqChain); why != "" {
		warnings = append(warnings, fmt.Sprintf("--masq-chain=%q: the original agent never wrote this chain (%s): it ran with no masquerade rules of its own, "+
			"and this agent runs with them (a deliberate difference; docs/configuration.md)", r.masqChain, why))
	}
	ports, err := nft.ParsePorts(r.toPorts)
	if err != nil {
		return nil, err
	}
	r.nft.ToPorts = ports
	if note := nft.PortsNote(r.toPorts, ports); note != "" {
		warnings = append(warnings, note)
	}
	r.nft.EnableIPv6 = r.flags.EnableIPv6
	return warnings, nil
}

// ignoredArgs is the warning about the words that end the daemon's flags:
// the original agent (Go's flag.Parse, as here) stopped at the first word
// that is not a flag and ran with the flags before it, so that word and
// everything after it had no effect. A word after a bool flag is the
// usual case: "--nomasq-all-reserved-ranges false" turns the flag ON.
func ignoredArgs(fs *flag.FlagSet, args []string) string {
	rest := fs.Args()
	first := len(args) - len(rest) // args[first] is the first word left
	msg := fmt.Sprintf("the command line's words from %q on are ignored, as by the original agent (flags end at the first word that is not a flag): %s",
		rest[0], strings.Join(rest, " "))
	if first > 0 && first <= len(args) && args[first-1] != "--" {
		prev := args[first-1]
		name := strings.TrimLeft(prev, "-")
		f := fs.Lookup(name)
		var b interface{ IsBoolFlag() bool }
		if f != nil {
			b, _ = f.Value.(interface{ IsBoolFlag() bool })
		}
		if b != nil && b.IsBoolFlag() && strings.HasPrefix(prev, "-") && !strings.Contains(name, "=") {
			msg = fmt.Sprintf("%s %s: the word %q is ignored, as by the original agent (a bool flag takes no separate value); the flag is %s",
				prev, rest[0], rest[0], onOff(f.Value.String()))
			if v, err := strconv.ParseBool(rest[0]); err == nil && strconv.FormatBool(v) != f.Value.String() {
				msg += fmt.Sprintf("; write %s=%t to turn it %s", prev, v, onOff(strconv.FormatBool(v)))
			}
			if len(rest) > 1 {
				msg += fmt.Sprintf("; the words after it are ignored too, flags among them, as by the original: %s", strings.Join(rest[1:], " "))
			}
		}
	}
	return msg
}

func onOff(v string) string {
	if v == "true" {
		return "ON"
	}
	return "OFF"
}

// resyncSeconds is Azure ip-masq-agent-v2's --resync-interval (an int of
// seconds, Go's flag.Int syntax): the resync interval of a config that sets
// no resyncInterval (Azure's config files have no such key). Azure's agent
// slept that many seconds between syncs, not at all for 0 or less; here,
// as for resyncInterval in the config, the interval is at least 1s.
func resyncSeconds(n int) (time.Duration, string) {
	if n < 1 {
		return time.Second, fmt.Sprintf("--resync-interval=%d is not positive; using 1s (Azure's ip-masq-agent-v2 re-synced without pause)", n)
	}
	if maxSeconds := int64(time.Duration(math.MaxInt64) / time.Second); int64(n) > maxSeconds {
		return time.Duration(maxSeconds) * time.Second, fmt.Sprintf("--resync-interval=%d is longer than Go's durations; using %ds", n, maxSeconds)
	}
	return time.Duration(n) * time.Second, ""
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

// logFlags are the logging flags the original agent's binary accepts: the
// ones klog.InitFlags registers (klog v2.140.0, which it vendors), with
// klog's defaults and klog's checks of their values, so that the original
// DaemonSet's args work unchanged. -v maps onto the log level; the others
// have no meaning here (logs always go to stderr, through log/slog) and are
// accepted with one warning naming them.
type logFlags struct {
	v klogLevel
}

// klogFlagNames lists every flag of klog.InitFlags, in klog's order.
var klogFlagNames = []string{"log_dir", "log_file", "log_file_max_size", "logtostderr", "alsologtostderr",
	"legacy_stderr_threshold_behavior", "v", "add_dir_header", "skip_headers", "one_output", "skip_log_headers",
	"stderrthreshold", "alsologtostderrthreshold", "vmodule", "log_backtrace_at"}

func (l *logFlags) register(fs *flag.FlagSet) {
	fs.String("log_dir", "", "ignored (klog flag of the original agent; logs go to stderr)")
	fs.String("log_file", "", "ignored (klog flag of the original agent; logs go to stderr)")
	fs.Uint64("log_file_max_size", 1800, "ignored (klog flag of the original agent)")
	fs.Bool("logtostderr", true, "ignored (klog flag of the original agent; logs always go to stderr)")
	fs.Bool("alsologtostderr", false, "ignored (klog flag of the original agent; logs always go to stderr)")
	fs.Bool("legacy_stderr_threshold_behavior", true, "ignored (klog flag of the original agent)")
	fs.Var(&l.v, "v", "klog-style verbosity: 2 or more logs at debug level")
	fs.Bool("add_dir_header", false, "ignored (klog flag of the original agent)")
	fs.Bool("skip_headers", false, "ignored (klog flag of the original agent)")
	fs.Bool("one_output", false, "ignored (klog flag of the original agent)")
	fs.Bool("skip_log_headers", false, "ignored (klog flag of the original agent)")
	stderr, also := klogSeverity(2), klogSeverity(0) // ERROR, INFO
	fs.Var(&stderr, "stderrthreshold", "ignored (klog flag of the original agent)")
	fs.Var(&also, "alsologtostderrthreshold", "ignored (klog flag of the original agent)")
	fs.Var(new(klogVModule), "vmodule", "ignored (klog flag of the original agent)")
	fs.Var(new(klogTrace), "log_backtrace_at", "ignored (klog flag of the original agent)")
}

// ignored returns the warning about the logging flags given on the command
// line that have no effect here; "" if none. --logtostderr=true and
// --alsologtostderr are what this agent does anyway.
func (l *logFlags) ignored(fs *flag.FlagSet) string {
	var names []string
	fs.Visit(func(f *flag.Flag) {
		switch {
		case !slices.Contains(klogFlagNames, f.Name), f.Name == "v", f.Name == "alsologtostderr",
			f.Name == "logtostderr" && f.Value.String() == "true":
			return
		}
		names = append(names, "--"+f.Name+"="+f.Value.String())
	})
	if len(names) == 0 {
		return ""
	}
	return "logging flags of the original agent (klog) have no effect here; logs go to stderr through log/slog " +
		"(--log-format, --log-level, --v): " + strings.Join(names, " ")
}

// klogLevel is klog's Level: a 32-bit integer.
type klogLevel int32

func (l *klogLevel) String() string { return strconv.Itoa(int(*l)) }

func (l *klogLevel) Set(s string) error {
	v, err := strconv.ParseInt(s, 10, 32)
	if err != nil {
		return err
	}
	*l = klogLevel(v)
	return nil
}

// klogSeverity is klog's severityValue: a name (INFO, WARNING, ERROR,
// FATAL, any case) or a number.
type klogSeverity int32

var klogSeverityNames = []string{"INFO", "WARNING", "ERROR", "FATAL"}

func (s *klogSeverity) String() string { return strconv.Itoa(int(*s)) }

func (s *klogSeverity) Set(value string) error {
	if i := slices.Index(klogSeverityNames, strings.ToUpper(value)); i >= 0 {
		*s = klogSeverity(i)
		return nil
	}
	v, err := strconv.ParseInt(value, 10, 32)
	if err != nil {
		return err
	}
	*s = klogSeverity(v)
	return nil
}

// klogVModule is klog's -vmodule: comma-separated PATTERN=N, N >= 0.
type klogVModule string

func (m *klogVModule) String() string { return string(*m) }

func (m *klogVModule) Set(value string) error {
	for _, pat := range strings.Split(value, ",") {
		if pat == "" {
			continue
		}
		patLev := strings.Split(pat, "=")
		if len(patLev) != 2 || patLev[0] == "" || patLev[1] == "" {
			return errors.New("syntax error: expect comma-separated list of filename=N")
		}
		v, err := strconv.ParseInt(patLev[1], 10, 32)
		if err != nil {
			return errors.New("syntax error: expect comma-separated list of filename=N")
		}
		if v < 0 {
			return errors.New("negative value for vmodule level")
		}
	}
	*m = klogVModule(value)
	return nil
}

// klogTrace is klog's -log_backtrace_at: empty, or FILE:N with a "." in
// FILE and N > 0.
type klogTrace string

func (t *klogTrace) String() string { return string(*t) }

func (t *klogTrace) Set(value string) error {
	if value != "" {
		fields := strings.Split(value, ":")
		if len(fields) != 2 || !strings.Contains(fields[0], ".") {
			return errors.New("syntax error: expect file.go:234")
		}
		v, err := strconv.Atoi(fields[1])
		if err != nil {
			return errors.New("syntax error: expect file.go:234")
		}
		if v <= 0 {
			return errors.New("negative or zero value for level")
		}
	}
	*t = klogTrace(value)
	return nil
}

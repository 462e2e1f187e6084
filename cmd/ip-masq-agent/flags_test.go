package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
)

// parseArgs parses the daemon's flags without starting it.
func parseArgs(t *testing.T, args ...string) (d daemonFlags, code int, done bool, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	d, code, done = parseDaemonFlags(args, &out, &errOut)
	return d, code, done, out.String(), errOut.String()
}

// Every flag that the original agent's binary accepts (its own and those
// that klog.InitFlags registers, klog v2.140.0) is accepted, with the
// values klog accepts.
func TestOriginalFlagsAccepted(t *testing.T) {
	args := []string{
		// The original agent's own flags.
		"--masq-chain=IP-MASQ", "--to-ports=1024-29999,32768-65535", "--nomasq-all-reserved-ranges",
		"--enable-ipv6=true", "--random-fully=false",
		// klog's.
		"--log_dir=/var/log", "--log_file=/var/log/ip-masq-agent.log", "--log_file_max_size=100",
		"--logtostderr=false", "--alsologtostderr", "--legacy_stderr_threshold_behavior=false", "--v=4",
		"--add_dir_header", "--skip_headers", "--one_output", "--skip_log_headers",
		"--stderrthreshold=WARNING", "--alsologtostderrthreshold=1", "--vmodule=agent=2,nft*=3,",
		"--log_backtrace_at=agent.go:10",
	}
	var given []string
	for _, a := range args {
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		given = append(given, name)
	}
	for _, name := range klogFlagNames {
		if !slices.Contains(given, name) {
			t.Errorf("the test does not give klog's flag --%s", name)
		}
	}
	d, code, done, out, errOut := parseArgs(t, args...)
	if done || code != 0 || out != "" || errOut != "" {
		t.Fatalf("parse: done=%v code=%d stdout %q stderr %q", done, code, out, errOut)
	}
	if d.logFlags.v != 4 || d.nft.Chain != "IP-MASQ" || !d.flags.EnableIPv6 || d.nft.RandomFully || !d.flags.NoMasqAllReservedRanges {
		t.Errorf("parsed %+v", d)
	}
	// One warning names every logging flag without effect here.
	w := d.logIgnored
	for _, name := range []string{"log_dir", "log_file", "log_file_max_size", "logtostderr", "legacy_stderr_threshold_behavior",
		"add_dir_header", "skip_headers", "one_output", "skip_log_headers", "stderrthreshold", "alsologtostderrthreshold",
		"vmodule", "log_backtrace_at"} {
		if !strings.Contains(w, "--"+name+"=") {
			t.Errorf("the warning does not name --%s: %q", name, w)
		}
	}
	if strings.Contains(w, "--v=") || strings.Contains(w, "--alsologtostderr=") {
		t.Errorf("the warning names a flag that has its meaning here: %q", w)
	}
	// The original DaemonSet's usual arguments need no warning.
	if d, code, done, _, _ := parseArgs(t, "--logtostderr", "--alsologtostderr", "--v=2"); done || code != 0 || d.logIgnored != "" {
		t.Errorf("--logtostderr --alsologtostderr --v=2: done=%v code=%d warning %q", done, code, d.logIgnored)
	}
	// Go's flag syntax, as the original's: one dash, separate value.
	if d, code, done, _, errOut := parseArgs(t, "-v", "3", "-stderrthreshold", "error", "-masq-chain", "X"); done || code != 0 || d.logFlags.v != 3 {
		t.Errorf("single-dash flags: done=%v code=%d %q", done, code, errOut)
	}
}

// Values that klog refuses are refused (exit 2), as the original refused them.
func TestOriginalFlagsBadValues(t *testing.T) {
	for _, arg := range []string{"--v=x", "--v=99999999999", "--stderrthreshold=LOUD", "--alsologtostderrthreshold=",
		"--vmodule=agent", "--vmodule=agent=-1", "--vmodule==2", "--log_backtrace_at=agent:10", "--log_backtrace_at=agent.go:0",
		"--log_file_max_size=-1", "--logtostderr=maybe", "--to-ports=x"} {
		if _, code, done, _, errOut := parseArgs(t, arg); !done || code != 2 || errOut == "" {
			t.Errorf("%s: done=%v code=%d stderr %q", arg, done, code, errOut)
		}
	}
}

func TestVersionAndHelpToStdout(t *testing.T) {
	_, code, done, out, errOut := parseArgs(t, "--version")
	if !done || code != 0 || out != "ip-masq-agent "+version+"\n" || errOut != "" {
		t.Errorf("--version: %d %q %q", code, out, errOut)
	}
	for _, arg := range []string{"--help", "-h", "-help"} {
		_, code, done, out, errOut = parseArgs(t, arg)
		if !done || code != 0 || !strings.HasPrefix(out, "Usage: ip-masq-agent") || !strings.Contains(out, "-stderrthreshold") || errOut != "" {
			t.Errorf("%s: %d %q %q", arg, code, out, errOut)
		}
	}
	// A bad flag: the error and the usage on stderr, nothing on stdout.
	_, code, done, out, errOut = parseArgs(t, "--no-such-flag")
	if !done || code != 2 || out != "" || !strings.Contains(errOut, "flag provided but not defined: -no-such-flag") ||
		!strings.Contains(errOut, "Usage: ip-masq-agent") {
		t.Errorf("bad flag: %d %q %q", code, out, errOut)
	}
}

// TestHelpKlogFlagsApart: --help lists the flags that mean something, and
// the ignored klog flags apart from them, by name only.
func TestHelpKlogFlagsApart(t *testing.T) {
	_, code, done, out, _ := parseArgs(t, "--help")
	if !done || code != 0 {
		t.Fatalf("--help: done=%v code=%d", done, code)
	}
	real, ignored, ok := strings.Cut(out, "\nAccepted for the original agent's DaemonSet args, and ignored")
	if !ok {
		t.Fatalf("--help has no block of ignored flags:\n%s", out)
	}
	for _, name := range klogFlagNames {
		inReal := strings.Contains(real, "\n  -"+name+" ") || strings.Contains(real, "\n  -"+name+"\n")
		switch {
		case name == "v" && !inReal:
			t.Errorf("-v (it sets the log level) is not among the flags")
		case name != "v" && inReal:
			t.Errorf("the ignored klog flag -%s is listed among the real flags", name)
		case name != "v" && !slices.Contains(strings.Fields(ignored), "--"+name):
			t.Errorf("the ignored klog flag --%s is not in the ignored block:\n%s", name, ignored)
		}
	}
	for _, name := range []string{"config", "http-address", "enable-ipv6", "masq-chain", "to-ports"} {
		if !strings.Contains(real, "\n  -"+name) {
			t.Errorf("--%s is not listed", name)
		}
	}
}

// TestEmptyHTTPAddressRefused: the probes need the endpoint, so the daemon
// refuses an empty --http-address; --once and --cleanup serve nothing.
func TestEmptyHTTPAddressRefused(t *testing.T) {
	if _, code, done, _, errOut := parseArgs(t, "--http-address="); !done || code != 2 || !strings.Contains(errOut, "probes") {
		t.Errorf("--http-address=: done=%v code=%d %q", done, code, errOut)
	}
	for _, extra := range []string{"--once", "--cleanup"} {
		if _, code, done, _, errOut := parseArgs(t, "--http-address=", extra); done || code != 0 {
			t.Errorf("--http-address= %s: done=%v code=%d %q", extra, done, code, errOut)
		}
	}
}

// Every flag of Azure/ip-masq-agent-v2 (cmd/ip-masq-agent-v2: its own four
// and those of klog.InitFlags, klog v2.130.1, a subset of the original's)
// is accepted; --resync-interval is honoured as the interval of a config
// that sets none.
func TestAzureFlagsAccepted(t *testing.T) {
	args := []string{
		"--masq-chain=IP-MASQ-AGENT", "--nomasq-all-reserved-ranges=false", "--enable-ipv6", "--resync-interval=30",
		"--log_dir=/tmp", "--log_file=/tmp/x.log", "--log_file_max_size=10", "--logtostderr", "--alsologtostderr=false",
		"--v=2", "--add_dir_header=false", "--skip_headers=false", "--one_output=false", "--skip_log_headers=false",
		"--stderrthreshold=2", "--vmodule=", "--log_backtrace_at=",
	}
	d, code, done, out, errOut := parseArgs(t, args...)
	if done || code != 0 || out != "" || errOut != "" {
		t.Fatalf("parse: done=%v code=%d stdout %q stderr %q", done, code, out, errOut)
	}
	if d.flags.ResyncInterval != 30*time.Second || !d.flags.EnableIPv6 {
		t.Errorf("parsed %+v", d.flags)
	}
	// Azure's agent masqueraded without --random-fully: the difference is warned about, once.
	if !strings.Contains(d.resyncWarning, "unless --random-fully=false") {
		t.Errorf("no warning about fully-random ports: %q", d.resyncWarning)
	}
	if d, _, _, _, _ := parseArgs(t, "--resync-interval=30", "--random-fully=false"); d.resyncWarning != "" || d.nft.RandomFully {
		t.Errorf("--random-fully=false given: warning %q", d.resyncWarning)
	}
	if got := config.Default(d.flags).ResyncInterval; got != 30*time.Second {
		t.Errorf("the default config's interval with --resync-interval=30: %s", got)
	}
	// A config's resyncInterval wins over the flag.
	if c, _, err := config.Parse([]byte("resyncInterval: 5s\n"), d.flags); err != nil || c.ResyncInterval != 5*time.Second {
		t.Errorf("config with resyncInterval: %s %v", c.ResyncInterval, err)
	}
	if c, _, err := config.Parse([]byte("nonMasqueradeCIDRs: [10.0.0.0/8]\n"), d.flags); err != nil || c.ResyncInterval != 30*time.Second {
		t.Errorf("config without resyncInterval: %s %v", c.ResyncInterval, err)
	}
	// Not given: the config's default, 60s.
	if d, _, _, _, _ := parseArgs(t, "--v=2"); d.flags.ResyncInterval != 0 || config.Default(d.flags).ResyncInterval != time.Minute {
		t.Errorf("without the flag: %s", d.flags.ResyncInterval)
	}
	// Go's flag.Int syntax, as Azure's; 0 or less: 1s with one warning; not a number: refused.
	for arg, want := range map[string]time.Duration{"-resync-interval=0x10": 16 * time.Second, "--resync-interval=0": time.Second, "--resync-interval=-5": time.Second} {
		d, code, done, _, errOut := parseArgs(t, arg, "--random-fully")
		if done || code != 0 || d.flags.ResyncInterval != want || (want == time.Second) != strings.Contains(d.resyncWarning, "--resync-interval=") {
			t.Errorf("%s: %s warning %q (%d %q)", arg, d.flags.ResyncInterval, d.resyncWarning, code, errOut)
		}
	}
	if _, code, done, _, errOut := parseArgs(t, "--resync-interval=1m"); !done || code != 2 || !strings.Contains(errOut, "resync-interval") {
		t.Errorf("--resync-interval=1m: %d %q", code, errOut)
	}
}

// TestDaemonIgnoresWords: the original agent's flag.Parse stopped at the
// first word that is no flag and ran with the flags before it, so
// "--nomasq-all-reserved-ranges false" turned the flag ON and the flags
// after the word had no effect. The daemon decides the same, and says so.
func TestDaemonIgnoresWords(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		check   func(daemonFlags) bool
		warning string
	}{
		{[]string{"--nomasq-all-reserved-ranges", "false"}, func(d daemonFlags) bool { return d.flags.NoMasqAllReservedRanges },
			`--nomasq-all-reserved-ranges false: the word "false" is ignored, as by the original agent (a bool flag takes no separate value); the flag is ON; write --nomasq-all-reserved-ranges=false to turn it OFF`},
		{[]string{"--enable-ipv6", "true"}, func(d daemonFlags) bool { return d.flags.EnableIPv6 && d.nft.EnableIPv6 },
			`--enable-ipv6 true: the word "true" is ignored, as by the original agent (a bool flag takes no separate value); the flag is ON`},
		// The flags after the word are ignored too, as by the original.
		{[]string{"--enable-ipv6", "false", "--masq-chain=OTHER", "--random-fully=false"},
			func(d daemonFlags) bool {
				return d.flags.EnableIPv6 && d.nft.Chain == "IP-MASQ-AGENT" && d.nft.RandomFully
			},
			`the words after it are ignored too, flags among them, as by the original: --masq-chain=OTHER --random-fully=false`},
		{[]string{"--masq-chain", "IP-MASQ", "extra"}, func(d daemonFlags) bool { return d.nft.Chain == "IP-MASQ" },
			`the command line's words from "extra" on are ignored, as by the original agent (flags end at the first word that is not a flag): extra`},
		{[]string{"--random-fully", "--", "x"}, func(d daemonFlags) bool { return d.nft.RandomFully },
			`words from "x" on are ignored`},
	} {
		d, code, done, _, errOut := parseArgs(t, tc.args...)
		if done || code != 0 || !tc.check(d) {
			t.Errorf("%q: code %d, done %v, flags %+v; %s", tc.args, code, done, d.options, errOut)
		}
		if !slices.ContainsFunc(d.warnings, func(w string) bool { return strings.Contains(w, tc.warning) }) {
			t.Errorf("%q: warnings %q, want one with %q", tc.args, d.warnings, tc.warning)
		}
	}
}

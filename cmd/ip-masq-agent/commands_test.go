package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
	"github.com/ip-masq-agent/ip-masq-agent-nft/original"
)

func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = runCommand(args[0], args[1:], &out, &errOut)
	return code, out.String(), errOut.String()
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestHelp(t *testing.T) {
	for _, c := range commands {
		for _, h := range []string{"--help", "-h"} {
			code, out, errOut := runCmd(t, c.name, h)
			if code != 0 || !strings.HasPrefix(out, "Usage: ip-masq-agent "+c.name) || !strings.Contains(out, "Example:\n  ip-masq-agent "+c.name) || errOut != "" {
				t.Errorf("%s %s: exit %d, stdout %q, stderr %q", c.name, h, code, out, errOut)
			}
		}
		if code, out, _ := runCmd(t, "help", c.name); code != 0 || !strings.Contains(out, "Example:") {
			t.Errorf("help %s: %d %q", c.name, code, out)
		}
	}
	code, out, _ := runCmd(t, "help")
	if code != 0 || !strings.Contains(out, "validate") || !strings.Contains(out, "diff") {
		t.Errorf("help: %d %q", code, out)
	}
	code, _, errOut := runCmd(t, "frobnicate")
	if code != 2 || !strings.Contains(errOut, `unknown command "frobnicate"`) {
		t.Errorf("unknown command: %d %q", code, errOut)
	}
	// The daemon's --help mentions the commands, goes to stdout and exits 0.
	var outBuf, errBuf bytes.Buffer
	if code := run([]string{"--help"}, &outBuf, &errBuf); code != 0 || !strings.Contains(outBuf.String(), "validate|render|explain|diff") ||
		!strings.Contains(outBuf.String(), "-masq-chain") || errBuf.Len() != 0 {
		t.Errorf("daemon --help: %d %q %q", code, outBuf.String(), errBuf.String())
	}
}

func TestValidateCommand(t *testing.T) {
	good := writeFile(t, "good.yaml", "nonMasqueradeCIDRs: [10.0.0.0/8]\n")
	warn := writeFile(t, "warn.yaml", "nonMasqueradeCIDRs: [10.0.0.0/8, 10.1.0.0/16]\nmasqLinkLocl: true\n")
	bad := writeFile(t, "cm.yaml", "apiVersion: v1\nkind: ConfigMap\ndata:\n  config: |\n    nonMasqueradeCIDRs:\n      - 10.0.0.1/8\n")
	v6 := writeFile(t, "v6.yaml", "nonMasqueradeCIDRs: [\"fd00::/8\"]\n")

	code, out, errOut := runCmd(t, "validate", good, warn)
	if code != 0 || out != warn+`:2: masqLinkLocl: unknown key ignored (did you mean "masqLinkLocal"?) (warning)`+"\n" ||
		errOut != "2 files checked: 0 errors, 1 warning\n" {
		t.Errorf("warnings only: %d %q %q", code, out, errOut)
	}
	code, out, _ = runCmd(t, "validate", warn, "--strict")
	if code != 1 || out != warn+`:1: nonMasqueradeCIDRs[1]: "10.1.0.0/16" is contained in nonMasqueradeCIDRs[0] "10.0.0.0/8", so it has no effect`+"\n"+
		warn+`:2: masqLinkLocl: unknown key (did you mean "masqLinkLocal"?)`+"\n" {
		t.Errorf("--strict: %d %q", code, out)
	}
	code, out, _ = runCmd(t, "validate", bad, good)
	if code != 1 || out != bad+`:6: nonMasqueradeCIDRs[0]: "10.0.0.1/8" is not aligned to its prefix length (did you mean "10.0.0.0/8"?)`+"\n" {
		t.Errorf("a manifest with an error: %d %q", code, out)
	}
	if code, out, _ = runCmd(t, "validate", v6); code != 1 || !strings.Contains(out, "--enable-ipv6") {
		t.Errorf("IPv6 without --enable-ipv6: %d %q", code, out)
	}
	if code, out, _ = runCmd(t, "validate", "--enable-ipv6", v6); code != 0 || out != "" {
		t.Errorf("IPv6 with --enable-ipv6: %d %q", code, out)
	}
	missing := filepath.Join(t.TempDir(), "missing.yaml")
	if code, out, _ = runCmd(t, "validate", missing); code != 1 || !strings.HasPrefix(out, missing+": cannot open: ") {
		t.Errorf("missing file: %d %q", code, out)
	}
	if code, _, errOut = runCmd(t, "validate"); code != 2 || !strings.Contains(errOut, "no FILE") {
		t.Errorf("no file: %d %q", code, errOut)
	}
	// A directory stands for its files named ip-masq*.
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "ip-masq-agent"), []byte("masqLinkLocal: 1\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "other"), []byte("not read: ["), 0o644)
	if code, out, _ = runCmd(t, "validate", dir); code != 1 || out != filepath.Join(dir, "ip-masq-agent")+":1: masqLinkLocal: expected true or false, got number 1\n" {
		t.Errorf("directory: %d %q", code, out)
	}
}

func TestRenderCommand(t *testing.T) {
	cfgText := "nonMasqueradeCIDRs: [10.0.0.0/8, \"fd00::/8\"]\nmasqueradeCIDRs: [10.10.10.10/32]\n"
	path := writeFile(t, "ip-masq-agent", cfgText)
	code, out, errOut := runCmd(t, "render", "--config", path, "--enable-ipv6", "--to-ports", "1024-65535", "--masq-chain", "X")
	label := uint8(nft.DefaultConntrackLabel)
	cfg, _, err := config.Parse([]byte(cfgText), config.Flags{EnableIPv6: true})
	if err != nil {
		t.Fatal(err)
	}
	want := "table inet ip-masq-agent\ndelete table inet ip-masq-agent\n" + nft.Render(nft.Build(cfg, nft.Options{
		Chain: "X", EnableIPv6: true, RandomFully: true, ToPorts: []nft.PortRange{{First: 1024, Last: 65535}}, CtLabel: &label}))
	// The only note: the original agent ignores masqueradeCIDRs.
	wantErr := "warning: " + path + ": masqueradeCIDRs: an extension of this agent (from Baidu CCE): the original agent ignores this key"
	if code != 0 || out != want || !strings.HasPrefix(errOut, wantErr) || strings.Count(errOut, "\n") != 1 {
		t.Errorf("render: %d %q\n%s\nwant\n%s", code, errOut, out, want)
	}
	if code, out, _ = runCmd(t, "render", "--config", path, "--enable-ipv6", "--replace=false", "--random-fully=false"); code != 0 ||
		strings.Contains(out, "delete table") || strings.Contains(out, "fully-random") {
		t.Errorf("--replace=false --random-fully=false: %d\n%s", code, out)
	}
	// A ConfigMap manifest works as --config.
	manifest := writeFile(t, "cm.yaml", "apiVersion: v1\nkind: ConfigMap\ndata:\n  config: |\n    nonMasqueradeCIDRs: [10.0.0.0/8]\n")
	if code, out, _ = runCmd(t, "render", "--config", manifest); code != 0 || !strings.Contains(out, "elements = { 10.0.0.0/8, 169.254.0.0/16 }") {
		t.Errorf("manifest: %d\n%s", code, out)
	}
	// A missing file means the defaults, as for the agent.
	code, out, errOut = runCmd(t, "render", "--config", filepath.Join(t.TempDir(), "none"))
	if code != 0 || !strings.Contains(out, "172.16.0.0/12") || !strings.Contains(errOut, "the defaults are in force") {
		t.Errorf("missing file: %d %q\n%s", code, errOut, out)
	}
	// Errors.
	bad := writeFile(t, "bad", "masqLinkLocal: 1\n")
	if code, _, errOut = runCmd(t, "render", "--config", bad); code != 2 || !strings.Contains(errOut, bad+": masqLinkLocal: expected true or false") {
		t.Errorf("bad config: %d %q", code, errOut)
	}
	// Inputs the original ran with: taken, with a warning on what they mean.
	for _, tc := range []struct{ args, out, warning []string }{
		{[]string{"--to-ports", "0"}, []string{"masquerade to :0-0"}, []string{"warning: --to-ports=0: installed as the original agent's iptables-restore installed it (masquerade to :0): port 0 alone masquerades every tcp, udp and sctp connection to source port 0"}},
		{[]string{"--to-ports", "0-65535"}, []string{"masquerade to :0-65535"}, []string{"a range from 0 (0-65535) lets the kernel pick source port 0"}},
		{[]string{"--masq-chain", "postrouting"}, []string{"chain POSTROUTING {", "jump POSTROUTING"}, []string{`warning: --masq-chain="postrouting": the decision chain is named POSTROUTING`}},
		{[]string{"--masq-chain", "1MASQ"}, []string{"chain IP-MASQ-AGENT {"}, []string{`warning: --masq-chain="1MASQ": the decision chain is named IP-MASQ-AGENT in table inet ip-masq-agent, because nft cannot read back a chain named "1MASQ"`}},
		{[]string{"--masq-chain", "MASQUERADE"}, []string{"chain MASQUERADE {"}, []string{`warning: --masq-chain="MASQUERADE": the original agent never wrote this chain (iptables refuses a chain named like a target`}},
	} {
		code, out, errOut := runCmd(t, append([]string{"render", "--config", path, "--enable-ipv6"}, tc.args...)...)
		if code != 0 {
			t.Errorf("render %v: %d %q", tc.args, code, errOut)
		}
		for _, w := range tc.out {
			if !strings.Contains(out, w) {
				t.Errorf("render %v: no %q in\n%s", tc.args, w, out)
			}
		}
		for _, w := range tc.warning {
			if !strings.Contains(errOut, w) {
				t.Errorf("render %v: no %q in %q", tc.args, w, errOut)
			}
		}
	}
	for _, args := range [][]string{{"--to-ports", "65536"}, {"--format", "yaml"}, {"extra"}} {
		if code, _, errOut = runCmd(t, append([]string{"render", "--config", path, "--enable-ipv6"}, args...)...); code != 2 || errOut == "" {
			t.Errorf("render %v: %d %q", args, code, errOut)
		}
	}
}

func TestRenderWindowsCommand(t *testing.T) {
	path := writeFile(t, "ip-masq-agent", "nonMasqueradeCIDRs: [192.168.0.0/16, 11.0.0.0/8, 10.137.196.0/23]\nmasqueradeCIDRs: [10.0.0.1/32]\n")
	code, out, errOut := runCmd(t, "render", "--config", path, "--format", "windows-cni")
	want := `{
  "name": "EndpointPolicy",
  "value": {
    "Type": "OutBoundNAT",
    "ExceptionList": [
      "192.168.0.0/16",
      "11.0.0.0/8",
      "10.137.196.0/23",
      "169.254.0.0/16"
    ]
  }
}
`
	if code != 0 || out != want || !strings.Contains(errOut, "\nwarning: masqueradeCIDRs (1) cannot be expressed") {
		t.Errorf("windows-cni: %d %q\n%s", code, errOut, out)
	}
}

func TestExplainCommand(t *testing.T) {
	path := writeFile(t, "ip-masq-agent", "nonMasqueradeCIDRs: [10.0.0.0/8]\nmasqueradeCIDRs: [10.10.10.10/32]\n")
	code, out, _ := runCmd(t, "explain", "--config", path, "10.1.2.3", "10.10.10.10", "169.254.169.254", "203.0.113.1", "2001:db8::1")
	want := `10.1.2.3         not masqueraded  nonMasqueradeCIDRs[0] 10.0.0.0/8
10.10.10.10      masquerade       masqueradeCIDRs[0] 10.10.10.10/32
169.254.169.254  not masqueraded  link-local 169.254.0.0/16 (masqLinkLocal: false)
203.0.113.1      masquerade       masqOutBound: true (no other rule matched)
2001:db8::1      not masqueraded  IPv6 is not handled without --enable-ipv6
`
	if code != 0 || out != want {
		t.Errorf("explain: %d\n%s\nwant\n%s", code, out, want)
	}
	// Flags after the addresses.
	if code, out, _ = runCmd(t, "explain", "2001:db8::1", "--config", path, "--enable-ipv6"); code != 0 || !strings.Contains(out, "masqOutBoundIPv6: true") {
		t.Errorf("flags after addresses: %d %q", code, out)
	}
	if code, _, errOut := runCmd(t, "explain", "--config", path, "10.0.0.300"); code != 2 || !strings.Contains(errOut, `"10.0.0.300" is not an IP address`) {
		t.Errorf("bad address: %d %q", code, errOut)
	}
	if code, _, errOut := runCmd(t, "explain", "--config", path); code != 2 || !strings.Contains(errOut, "no ADDRESS") {
		t.Errorf("no address: %d %q", code, errOut)
	}
}

func TestDaemonFlagsUnchanged(t *testing.T) {
	// The daemon refuses bad values of the shared flags. (Words after its
	// flags are ignored, as by the original: TestDaemonIgnoresWords.)
	var outBuf, errBuf bytes.Buffer
	if code := run([]string{"--to-ports", "5-1"}, &outBuf, &errBuf); code != 2 || !strings.Contains(errBuf.String(), "--to-ports") {
		t.Errorf("bad --to-ports: %d %q", code, errBuf.String())
	}
	errBuf.Reset()
	if code := run([]string{"--version"}, &outBuf, &errBuf); code != 0 || !strings.Contains(outBuf.String(), "ip-masq-agent") || errBuf.Len() != 0 {
		t.Errorf("--version: %d %q %q", code, outBuf.String(), errBuf.String())
	}
}

// TestToolsReadTheAgentsFlags: in the agent's pod (the agent is process 1),
// render, explain and diff take the ruleset flags they are not given from
// the agent's command line; flags given win; --agent-pid=none ignores it;
// a process 1 that is not the agent is ignored.
func TestToolsReadTheAgentsFlags(t *testing.T) {
	cfg := writeFile(t, "agent-config", "nonMasqueradeCIDRs: [10.0.0.0/8, fd00::/8]\n")
	argv := []string{"/ip-masq-agent", "--config=" + cfg, "--enable-ipv6", "--http-address=127.0.0.1:9753", "--masq-chain", "IP-MASQ", "--v=2"}
	old := procCmdline
	t.Cleanup(func() { procCmdline = old })
	procCmdline = func(pid int) ([]string, error) {
		if pid != 1 {
			return nil, os.ErrNotExist
		}
		return argv, nil
	}
	code, out, errOut := runCmd(t, "render")
	if code != 0 || !strings.Contains(out, "fd00::/8") || !strings.Contains(out, "chain IP-MASQ {") {
		t.Errorf("render in the agent's pod: %d %q\n%s", code, errOut, out)
	}
	if !strings.Contains(errOut, "note: with the running agent's flags (pid 1): --config="+cfg+" --enable-ipv6=true --masq-chain=IP-MASQ") {
		t.Errorf("render does not say which flags it took: %q", errOut)
	}
	if code, out, _ := runCmd(t, "explain", "10.1.2.3"); code != 0 || !strings.Contains(out, "nonMasqueradeCIDRs[0] 10.0.0.0/8") {
		t.Errorf("explain in the agent's pod: %d\n%s", code, out)
	}
	// Flags given win.
	if code, out, _ := runCmd(t, "render", "--masq-chain=OTHER"); code != 0 || !strings.Contains(out, "fd00::/8") || !strings.Contains(out, "chain OTHER {") {
		t.Errorf("render with flags given: %d\n%s", code, out)
	}
	if code, out, errOut := runCmd(t, "render", "--agent-pid=none"); code != 0 || strings.Contains(out, "IP-MASQ {") || strings.Contains(errOut, "running agent") {
		t.Errorf("--agent-pid=none: %d %q\n%s", code, errOut, out)
	}
	if code, _, errOut := runCmd(t, "render", "--agent-pid=7"); code != 2 || !strings.Contains(errOut, "--agent-pid 7") {
		t.Errorf("--agent-pid=7 (no such process): %d %q", code, errOut)
	}
	// Process 1 is not the agent (a node, a test machine): nothing is taken.
	argv = []string{"/sbin/init", "splash"}
	if code, out, errOut := runCmd(t, "render"); code != 0 || strings.Contains(out, "IP-MASQ {") || strings.Contains(errOut, "running agent") {
		t.Errorf("process 1 is init: %d %q\n%s", code, errOut, out)
	}
	// Nor is the agent running a tool.
	argv = []string{"/ip-masq-agent", "render", "--config=" + cfg}
	if code, _, errOut := runCmd(t, "render"); code != 0 || strings.Contains(errOut, "running agent") {
		t.Errorf("process 1 is a tool: %d %q", code, errOut)
	}
}

// TestValidateFlags: validate names what --masq-chain and --to-ports mean
// here before the switch: a chain spelled otherwise, one the original
// never wrote (a deliberate difference), ports reaching 0.
func TestValidateFlags(t *testing.T) {
	good := writeFile(t, "good.yaml", "nonMasqueradeCIDRs: [10.0.0.0/8]\n")
	code, out, errOut := runCmd(t, "validate", "--masq-chain", "1MASQ", good)
	if code != 0 || !strings.Contains(out, `--masq-chain="1MASQ": the decision chain is named IP-MASQ-AGENT`) || !strings.Contains(errOut, "1 file checked: 0 errors, 1 warning") {
		t.Errorf("--masq-chain 1MASQ: %d %q %q", code, out, errOut)
	}
	code, out, _ = runCmd(t, "validate", "--strict", "--masq-chain", strings.Repeat("M", 29))
	if code != 1 || !strings.Contains(out, "the original agent never wrote this chain (iptables refuses chain names of 29 characters or more") {
		t.Errorf("--masq-chain of 29: %d %q", code, out)
	}
	code, out, _ = runCmd(t, "validate", "--to-ports", "0")
	if code != 0 || !strings.Contains(out, "(masquerade to :0): port 0 alone masquerades every tcp, udp and sctp connection to source port 0") {
		t.Errorf("--to-ports 0: %d %q", code, out)
	}
	if code, out, _ = runCmd(t, "validate", "--to-ports", "70000"); code != 1 || !strings.Contains(out, "70000 is not a port") {
		t.Errorf("--to-ports 70000: %d %q", code, out)
	}
	if code, out, _ = runCmd(t, "validate", "--masq-chain", "IP-MASQ", good); code != 0 || out != "" {
		t.Errorf("--masq-chain IP-MASQ: %d %q", code, out)
	}
}

// validate DIR: the files with Azure's meaning (the keys it does not read
// warned about, not refused), and the directory's own warnings: a dangling
// ip-masq* link, an empty union.
func TestValidateAzureDirectory(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "ip-masq-agent"), []byte("resyncInterval: soon\n"), 0o644)
	os.Symlink("..data/ip-masq-gone", filepath.Join(dir, "ip-masq-reconciled"))
	code, out, errOut := runCmd(t, "validate", dir)
	file := filepath.Join(dir, "ip-masq-agent")
	if code != 0 ||
		!strings.Contains(out, filepath.Join(dir, "ip-masq-reconciled")+`: a symlink to "..data/ip-masq-gone", which does not exist`) ||
		!strings.Contains(out, dir+": no file named ip-masq* sets a non-empty nonMasqueradeCIDRs") ||
		!strings.Contains(out, file+":1: resyncInterval: not read in a config directory") ||
		!strings.Contains(errOut, "1 file checked: 0 errors, 3 warnings") {
		t.Errorf("validate DIR: %d %q %q", code, out, errOut)
	}
	if code, _, _ := runCmd(t, "validate", "--strict", dir); code != 1 {
		t.Errorf("validate --strict DIR: %d, want 1", code)
	}
	// The same file alone has the original's meaning: refused.
	if code, _, _ := runCmd(t, "validate", file); code != 1 {
		t.Errorf("validate FILE: %d, want 1", code)
	}
}

// diff: an inexact comparison with no range found is not "changes none":
// it counts (exit 1) and says so.
func TestPrintComparisonInexact(t *testing.T) {
	var b bytes.Buffer
	if n := printComparison(&b, original.Comparison{Found: true, Inexact: true}); n == 0 || strings.Contains(b.String(), "changes none") {
		t.Errorf("inexact comparison counted %d:\n%s", n, b.String())
	}
}

// diff: a comparison with only notes (source ports) counts (exit 1).
func TestPrintComparisonNotes(t *testing.T) {
	var b bytes.Buffer
	if n := printComparison(&b, original.Comparison{Found: true, Notes: []string{"ipv4 masquerade source ports: x"}}); n == 0 || !strings.Contains(b.String(), "change ipv4 masquerade source ports") {
		t.Errorf("notes counted %d:\n%s", n, b.String())
	}
}

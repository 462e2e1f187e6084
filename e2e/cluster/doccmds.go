package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"time"
)

// The operator's commands as the docs print them. The fenced sh blocks of
// README.md, docs/runbook.md and docs/upgrade.md are read by the run, and
// the run executes those lines verbatim with bash in the node (kubectl is
// the run's, found on PATH, with KUBECONFIG; `bin/` holds the agent binary
// that `make image` built, as `make build` would), so a doc edit that
// breaks a command fails the run. Only what cannot be the same here is
// rewritten, each time said in the check's line (docRewrites: no registry,
// so the local image, and the e2e overlays of deploy/uninstall/ and
// deploy/rollback/ for their pause image; make runs in the repository;
// NODE= names the run's node). Every command of those blocks
// is either run, or listed in docNotRun with the reason; a command in
// neither fails the run, and so does an entry of docNotRun that no longer
// matches a command. A command printed twice (README and docs/upgrade.md)
// counts as run when its text ran.

// docFiles are the files whose sh blocks the run knows, every command.
var docFiles = []string{"README.md", "docs/runbook.md", "docs/upgrade.md"}

// docCommand is one command line of a fenced sh block.
type docCommand struct {
	file    string // relative to the repository
	section string // the heading above the block
	line    int
	text    string // the command, without its trailing comment
}

func (c docCommand) String() string { return fmt.Sprintf("%s:%d: %s", c.file, c.line, c.text) }

// docNotRun: the commands that the run does not execute, by their text
// (after the comment is stripped), with why.
var docNotRun = map[string]string{
	"podman login registry.example.com":                                                       "no registry here: the image is built with make image and imported into the node's containerd",
	"make push IMAGE=registry.example.com/ip-masq-agent-nft TAG=v0.1.0":                       "no registry here (make image builds the image the run imports)",
	"kubectl -n kube-system edit configmap ip-masq-agent":                                     "interactive (an editor); the config change step applies an edited ConfigMap with kubectl apply",
	"kubectl debug node/$NODE -it --image=busybox -- sh -c 'ps -ef | grep -e ip-masq -e nft'": "interactive, and pulls busybox: no registry here",
	"kubectl debug node/$NODE -it --image=curlimages/curl -- curl -s 127.0.0.1:9753/readyz":   "interactive, and pulls curlimages/curl: no registry here (the bad-config step checks the same reason in the agent's log)",
	`iptables-legacy -t nat -D POSTROUTING -m comment --comment "ip-masq-agent: ensure nat POSTROUTING directs all non-LOCAL destination traffic to our custom IP-MASQ-AGENT chain" -m addrtype ! --dst-type LOCAL -j IP-MASQ-AGENT`: "the node has no iptables-legacy tables here (the agent's warning that prints these is a kernel test's)",
	"iptables-legacy -t nat -F IP-MASQ-AGENT":                                           "the node has no iptables-legacy tables here",
	"iptables-legacy -t nat -X IP-MASQ-AGENT":                                           "the node has no iptables-legacy tables here",
	"nft list ruleset | sed '/^table inet ip-masq-agent /,/^}$/d' > /etc/nftables.conf": "would write the machine's /etc/nftables.conf (the node shares the machine's /etc)",
}

// docRewrite is one substitution of docRewrites.
type docRewrite struct {
	re  *regexp.Regexp
	new func(d *docShell) string
}

// docRewrites: what differs here from an operator's cluster, in the
// order applied.
var docRewrites = []docRewrite{
	// NODE=node-1: the docs' placeholder is the run's node.
	{regexp.MustCompile(`^NODE=\S+$`), func(*docShell) string { return "NODE=" + nodeName }},
	// make in the repository (the commands' other files are in the working directory).
	{regexp.MustCompile(`^make `), func(d *docShell) string { return "make -C " + shellQuote(d.s.repo) + " " }},
	// No registry: the image that make image built, imported into containerd.
	{regexp.MustCompile(`registry\.example\.com/ip-masq-agent-nft`), func(*docShell) string { return agentImage }},
	{regexp.MustCompile(`\bTAG=v0\.1\.0\b`), func(*docShell) string { return "TAG=" + agentTag }},
	// bin/manifests/install.yaml runs as printed: make manifests wrote it
	// for the local image, which containerd holds (IfNotPresent). Its
	// uninstall and rollback manifests name registry.k8s.io/pause too,
	// which cannot be pulled here: the e2e overlays of deploy/uninstall/ and
	// deploy/rollback/ instead, the same agent image and the local pause
	// image (imagePullPolicy Never).
	{regexp.MustCompile(`-f bin/manifests/rollback\.yaml$`), func(d *docShell) string { return "-k " + shellQuote(filepath.Join(d.s.e2eDir, "rollback")) }},
	{regexp.MustCompile(`-f bin/manifests/uninstall\.yaml$`), func(d *docShell) string { return "-k " + shellQuote(filepath.Join(d.s.e2eDir, "uninstall")) }},
}

// rewrite returns the command as the run executes it.
func (d *docShell) rewrite(text string) string {
	for _, r := range docRewrites {
		text = r.re.ReplaceAllLiteralString(text, r.new(d))
	}
	return text
}

var docAssign = regexp.MustCompile(`^([A-Z_][A-Z0-9_]*)=`)

// stripComment removes a shell comment (# at the start of a word, outside
// quotes) and the space around the command.
func stripComment(line string) string {
	var quote rune
	prev := ' '
	for i, r := range line {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '\'' || r == '"':
			quote = r
		case r == '#' && (prev == ' ' || prev == '\t'):
			return strings.TrimSpace(line[:i])
		}
		prev = r
	}
	return strings.TrimSpace(line)
}

// docCommands returns the commands of file's fenced sh blocks, in order.
func docCommands(repo, file string) ([]docCommand, error) {
	data, err := os.ReadFile(filepath.Join(repo, file))
	if err != nil {
		return nil, err
	}
	var out []docCommand
	section, fence, sh := "", false, false
	cont := ""
	for i, raw := range strings.Split(string(data), "\n") {
		line := strings.TrimSpace(raw)
		if fence {
			if strings.HasPrefix(line, "```") {
				fence, sh = false, false
				continue
			}
			if !sh {
				continue
			}
			cmd := stripComment(line)
			if c, ok := strings.CutSuffix(cmd, "\\"); ok {
				cont += c
				continue
			}
			cmd, cont = cont+cmd, ""
			if cmd != "" {
				out = append(out, docCommand{file, section, i + 1, cmd})
			}
			continue
		}
		switch {
		case strings.HasPrefix(line, "```"):
			fence = true
			lang := strings.TrimPrefix(line, "```")
			sh = lang == "sh" || lang == "bash" || lang == "shell"
		case strings.HasPrefix(raw, "#"):
			section = strings.TrimSpace(strings.TrimLeft(line, "#"))
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no command in a fenced sh block", file)
	}
	return out, nil
}

// docResult is what one command printed and its exit status.
type docResult struct {
	cmd            docCommand
	ran            string // the command as run (rewritten)
	stdout, stderr string
	code           int
	err            error // the run could not start it, or it timed out
}

func (r docResult) String() string {
	s := fmt.Sprintf("exit %d", r.code)
	if r.err != nil {
		s = r.err.Error()
	}
	out := strings.TrimSpace(r.stdout)
	if e := strings.TrimSpace(r.stderr); e != "" {
		out += " [stderr: " + e + "]"
	}
	return s + ": " + clip(oneLine(out, nil), 400)
}

// docShell runs the docs' commands: it keeps the variables that the docs
// set (NODE, POD) and where the run has them.
type docShell struct {
	s    *suite
	dir  string   // the working directory: bin/ip-masq-agent, cm.yaml
	vars []string // the assignment lines run so far, as printed (NODE: the run's node)
	all  map[string][]docCommand
	ran  map[string]bool // the text of the commands run
	// goEnv: the Go caches of the machine, for make (HOME is the run's).
	goEnv []string
}

// newDocShell reads the docs' commands and prepares the working directory.
func (s *suite) newDocShell() (*docShell, error) {
	d := &docShell{s: s, dir: s.n.path("docs-cwd"), all: map[string][]docCommand{}, ran: map[string]bool{}}
	for _, f := range docFiles {
		cmds, err := docCommands(s.repo, f)
		if err != nil {
			return nil, err
		}
		d.all[f] = cmds
	}
	if err := os.MkdirAll(filepath.Join(d.dir, "bin"), 0o755); err != nil {
		return nil, err
	}
	// make image built it (the binary the image holds); make build puts
	// the same program at bin/ip-masq-agent.
	b, err := os.ReadFile(filepath.Join(s.repo, "bin", "linux-"+runtime.GOARCH, "ip-masq-agent"))
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(d.dir, "bin", "ip-masq-agent"), b, 0o755); err != nil {
		return nil, err
	}
	// make manifests writes bin/manifests/ in the repository.
	if err := os.Symlink(filepath.Join(s.repo, "bin", "manifests"), filepath.Join(d.dir, "bin", "manifests")); err != nil {
		return nil, err
	}
	out, err := run(s.ctx, time.Minute, goTool(), "env", "GOCACHE", "GOMODCACHE", "GOPATH")
	if err != nil {
		return nil, err
	}
	if f := strings.Fields(out); len(f) == 3 {
		d.goEnv = []string{"GOCACHE=" + f[0], "GOMODCACHE=" + f[1], "GOPATH=" + f[2], "GO=" + goTool()}
	}
	return d, nil
}

// find returns the one command of file under a heading that starts with
// section and contains every one of words.
func (d *docShell) find(file, section string, words ...string) (docCommand, error) {
	var found []docCommand
	for _, c := range d.all[file] {
		if !strings.HasPrefix(c.section, section) {
			continue
		}
		ok := true
		for _, w := range words {
			ok = ok && strings.Contains(c.text, w)
		}
		if ok {
			found = append(found, c)
		}
	}
	if len(found) != 1 {
		return docCommand{}, fmt.Errorf("%s, section %q: %d commands contain %q, want 1: %v", file, section, len(found), words, found)
	}
	return found[0], nil
}

// section returns the commands of file under headings starting with name.
func (d *docShell) section(file, name string) []docCommand {
	var out []docCommand
	for _, c := range d.all[file] {
		if strings.HasPrefix(c.section, name) {
			out = append(out, c)
		}
	}
	return out
}

// run executes one command as printed, after the assignments run so far;
// an assignment is kept for the commands that follow. rewrite, if given,
// replaces the command's text (and the report says so).
func (d *docShell) run(c docCommand, timeout time.Duration) docResult {
	d.ran[c.text] = true
	text := d.rewrite(c.text)
	// As an operator's shell runs it: a pipeline's status is its last
	// command's (kubectl's errors show on stderr; exit0 checks that).
	script := "cd " + shellQuote(d.dir) + "\n" + strings.Join(d.vars, "\n") + "\n" + text + "\n"
	env := append(baseEnv(d.s.n), "KUBECONFIG="+d.s.admin)
	env[0] = "PATH=" + d.s.kubeBin + ":" + strings.TrimPrefix(env[0], "PATH=") + ":" + os.Getenv("PATH")
	env = append(env, d.goEnv...)
	stdout, stderr, err := runEnv(d.s.ctx, timeout, env, d.s.n.inNode("bash", "-c", script))
	r := docResult{cmd: c, ran: text, stdout: stdout, stderr: stderr}
	var ee interface{ ExitCode() int }
	switch {
	case err == nil:
	case errors.As(err, &ee) && ee.ExitCode() > 0 && d.s.ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded):
		r.code = ee.ExitCode()
	default:
		r.code, r.err = -1, err
	}
	if isAssignment(text) {
		d.vars = append(d.vars, text)
	}
	return r
}

// isAssignment: a line that only sets a variable (NODE=node-1,
// POD=$(kubectl ...)), which the commands after it use.
func isAssignment(text string) bool {
	m := docAssign.FindStringSubmatch(text)
	if m == nil {
		return false
	}
	v := text[len(m[0]):]
	return !strings.ContainsAny(v, " \t") || strings.HasPrefix(v, "$(") && strings.HasSuffix(v, ")") && strings.Count(v, "$(") == 1
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// docCheck is what a command must print; nil: exit 0.
type docCheck func(r docResult) bool

func exit0(words ...string) docCheck {
	return func(r docResult) bool {
		if r.err != nil || r.code != 0 || kubectlError(r.stderr) {
			return false
		}
		for _, w := range words {
			if !strings.Contains(r.stdout+r.stderr, w) {
				return false
			}
		}
		return true
	}
}

// kubectlError: stderr holds an error of kubectl (in a pipeline, whose
// status is the last command's).
func kubectlError(stderr string) bool {
	return strings.Contains(stderr, "Error from server") || strings.HasPrefix(strings.TrimSpace(stderr), "error:") || strings.Contains(stderr, "\nerror:")
}

// noneOrSome: a pipeline ending in grep that found nothing exits 1 with no
// output; an error of kubectl prints one.
func noneOrSome(r docResult) bool {
	return r.err == nil && !kubectlError(r.stderr) && (r.code == 0 || r.code == 1 && strings.TrimSpace(r.stdout+r.stderr) == "")
}

// noCannotRun: the runbook's `logs $POD --previous | grep 'cannot run'`
// on a node whose kernel runs the agent: no previous container (kubectl's
// one error line says so, and grep finds nothing: exit 1), or one whose
// log has no such line (exit 1, nothing printed); never a line that says
// "cannot run", and no other error.
func noCannotRun(r docResult) bool {
	e := strings.TrimSpace(r.stderr)
	return r.err == nil && r.code == 1 && strings.TrimSpace(r.stdout) == "" &&
		(e == "" || strings.Contains(e, "previous terminated container") && !strings.Contains(e, "\n"))
}

// runChecked runs a command and records one assertion.
func (d *docShell) runChecked(c docCommand, check docCheck, what string) docResult {
	if check == nil {
		check = exit0()
	}
	r := d.run(c, 3*time.Minute)
	as := ""
	if r.ran != c.text {
		as = " [run as: " + r.ran + "]"
	}
	d.s.assert(check(r), "%s: %s (%s)%s -> %s", c.file, c.text, what, as, r)
	return r
}

// coverage fails the run for every command of the docs that was neither
// run nor listed in docNotRun, and for every docNotRun entry that matches
// no command.
func (d *docShell) coverage() {
	listed := map[string]bool{}
	var missing []string
	ran := 0
	for _, f := range docFiles {
		for _, c := range d.all[f] {
			switch {
			case d.ran[c.text]:
				ran++
			case docNotRun[c.text] != "":
				listed[c.text] = true
			default:
				missing = append(missing, c.String())
			}
		}
	}
	var stale []string
	for k := range docNotRun {
		if !listed[k] {
			stale = append(stale, k)
		}
	}
	sort.Strings(stale)
	n := 0
	for _, f := range docFiles {
		n += len(d.all[f])
	}
	d.s.assert(len(missing) == 0 && len(stale) == 0,
		"every command of the sh blocks of %s (%d) ran as printed (%d) or is listed as not run, with why (%d): not run and not listed: %v; listed but not in the docs (or run): %v",
		strings.Join(docFiles, ", "), n, ran, n-ran-len(missing), missing, stale)
	for _, f := range docFiles {
		for _, c := range d.all[f] {
			if why := docNotRun[c.text]; why != "" && !d.ran[c.text] {
				d.s.logf("  not run as printed: %s: %s", c.String(), why)
			}
		}
	}
}

// agentFlagsNote is what the tools print in the agent's pod: they took the
// flags not given from the running agent's command line (process 1).
const agentFlagsNote = "note: with the running agent's flags (pid 1)"

// docCommandsOnNode runs README's Verify, Configure and Troubleshoot
// blocks and every block of docs/runbook.md, as printed, against the
// agent's pod on the node, under the changed config
// (nonMasqueradeCIDRs: [203.0.113.0/24]: 10.1.2.3 is masqueraded,
// 203.0.113.1 is not). Each command's output is checked for what the docs
// say it shows.
func (s *suite) docCommandsOnNode() error {
	d := s.docs
	s.logf("the docs' commands as printed: README Verify, Configure and Troubleshoot; docs/runbook.md, every symptom (NODE=%s)", nodeName)
	// The tools in the pod, which take the running agent's flags.
	tool := func(words ...string) docCheck {
		return exit0(append(words, agentFlagsNote)...)
	}
	previous := func(r docResult) bool { // no container of the pod has crashed
		return r.err == nil && (r.code == 0 || strings.Contains(r.stderr, "previous terminated container"))
	}
	checks := []struct {
		file, section, words string
		check                docCheck
		what                 string
		before               func() error
	}{
		{"README.md", "Verify", "-o wide", exit0("1/1", "Running"), "READY 1/1", nil},
		{"README.md", "Verify", "NODE=", nil, "the node to look at", nil},
		{"README.md", "Verify", "POD=", nil, "its agent pod", nil},
		{"README.md", "Verify", "head -5", exit0("starting ip-masq-agent", "applied config"), "the start", nil},
		{"README.md", "Verify", "ip-masq-agent diff", tool("in sync"), "in sync", nil},
		{"README.md", "Verify", "explain --live", tool("10.1.2.3", "203.0.113.1", "not masqueraded"), "the decisions, the kernel's too", nil},
		{"README.md", "Configure", "validate --strict config", exit0(), "the operator's file", nil},
		{"README.md", "Configure", "applied new config", exit0("applied new config"), "the change applied", nil},
		{"README.md", "Troubleshoot", "level=(WARN|ERROR)", noneOrSome, "warnings, if any", nil},
		{"README.md", "Troubleshoot", "ip-masq-agent diff", tool("in sync"), "in sync", nil},
		{"README.md", "Troubleshoot", "explain --live 10.1.2.3", tool("10.1.2.3", "masquerade"), "which rule decides", nil},

		{"docs/runbook.md", "Runbook", "NODE=", nil, "set first", nil},
		{"docs/runbook.md", "Runbook", "POD=", nil, "set first", nil},
		{"docs/runbook.md", "Runbook", "echo $POD", exit0("pod/ip-masq-agent-nft-"), "the pod on the node", nil},
		{"docs/runbook.md", "Egress broke", "does not exist", exit0("applied new config", "changes="), "what changed", nil},
		{"docs/runbook.md", "Egress broke", "explain --live 10.1.2.3", tool("10.1.2.3", "masquerade", "config:", "kernel:"), "the key and the kernel's rule", nil},
		{"docs/runbook.md", "Egress broke", "> cm.yaml", exit0(), "the ConfigMap to edit", nil},
		{"docs/runbook.md", "Egress broke", "validate --strict cm.yaml", exit0(), "the manifest checks", nil},
		{"docs/runbook.md", "Egress broke", "explain --config cm.yaml 10.1.2.3", exit0("10.1.2.3", "masquerade"), "the decision it will make", nil},
		{"docs/runbook.md", "Egress broke", "apply -f cm.yaml", exit0("configmap/ip-masq-agent"), "applied", nil},
		{"docs/runbook.md", "Egress broke", "ip-masq-agent diff", tool("in sync"), "how far a change has spread", nil},
		// The bad-config procedure: the ConfigMap goes bad (a CIDR that is
		// not one), the pod turns NotReady, the runbook's commands show why
		// and what the kernel does, the fix is applied as printed, and the
		// agent logs the recovery.
		{"docs/runbook.md", "The ConfigMap is bad", "get $POD", exit0("0/1", "Running"), "NotReady, not restarted", s.badConfigMap},
		{"docs/runbook.md", "The ConfigMap is bad", "Readiness probe failed", exit0("Readiness probe failed: HTTP probe failed with statuscode: 503"), "what the kubelet shows", nil},
		{"docs/runbook.md", "The ConfigMap is bad", "config not applied|config is good again", exit0("config not applied", badCIDR, "nonMasqueradeCIDRs"), "the reason: file, key, value", nil},
		{"docs/runbook.md", "The ConfigMap is bad", "explain --live 10.1.2.3", func(r docResult) bool {
			return r.err == nil && r.code == 3 && !kubectlError(r.stderr) && strings.Contains(r.stderr, agentFlagsNote) &&
				strings.Contains(r.stderr, "config not applied: ") && strings.Contains(r.stderr, badCIDR) &&
				strings.Contains(r.stdout, "10.1.2.3\n  config: bad, not applied") && strings.Contains(r.stdout, "kernel: masquerade: ")
		}, "exit 3: the config's error, and what the kernel does now (10.1.2.3 masqueraded under the last good config)", nil},
		{"docs/runbook.md", "The ConfigMap is bad", "> cm.yaml", exit0(), "the bad ConfigMap to fix", nil},
		{"docs/runbook.md", "The ConfigMap is bad", "validate --strict cm.yaml", exit0(), "the fixed manifest checks", d.fixCMYAML},
		{"docs/runbook.md", "The ConfigMap is bad", "apply -f cm.yaml", exit0("configmap/ip-masq-agent"), "the fix applied", nil},
		{"docs/runbook.md", "The ConfigMap is bad", "grep 'config is good again'", exit0(`msg="config is good again; applied"`), "the recovery logged", s.waitRecovered},
		{"docs/runbook.md", "Pod NotReady", "level=(WARN|ERROR)", noneOrSome, "warnings, if any", nil},
		{"docs/runbook.md", "Pod NotReady", "ip-masq-agent list", exit0("table inet ip-masq-agent"), "the kernel's table", nil},
		{"docs/runbook.md", "Pod restarting", "cannot run", noCannotRun, "this kernel runs the agent: no such line", nil},
		{"docs/runbook.md", "Rival writer", "owns table", noneOrSome, "no rival here", nil},
		{"docs/runbook.md", "Rival writer", "get daemonsets -A", exit0("ip-masq-agent-nft"), "the DaemonSets", nil},
		{"docs/runbook.md", "Rival writer", "get pods -A", exit0("ip-masq-agent-nft-"), "the pods on the node", nil},
		// The switch changed decisions: the addon's original rules (its
		// reserved ranges, no ConfigMap) beside this agent's config, which
		// masquerades 100.64.0.0/10.
		{"docs/runbook.md", "The switch changed decisions", "diff --decisions", func(r docResult) bool {
			return r.err == nil && r.code == 1 && strings.Contains(r.stdout, "change ipv4 100.64.0.0/10: original: not masqueraded, this agent: masquerade; to keep the original's decision: nonMasqueradeCIDRs: add 100.64.0.0/10")
		}, "exit 1: each range that changes, with the key that keeps it (this ConfigMap lists nonMasqueradeCIDRs, so the flag would not)", s.writeAddonOnce},
		{"docs/runbook.md", "The switch changed decisions", "explain --live 100.64.0.10", func(r docResult) bool {
			return r.err == nil && r.code == 1 && strings.Contains(r.stdout, "  original: not masqueraded") && strings.Contains(r.stdout, "  SWITCH: ipv4 100.64.0.0/10")
		}, "exit 1: both decisions for the address", nil},
		{"docs/runbook.md", "Old rules", "grep -E 'original ip-masq-agent'", exit0("original ip-masq-agent"), "what the agent found", s.writeOriginalOnce},
		{"docs/runbook.md", "Old rules", "ip-masq-agent diff", func(r docResult) bool {
			return r.err == nil && r.code == 1 && strings.Contains(r.stdout, "original") && strings.Contains(r.stderr, agentFlagsNote)
		}, "exit 1: the original's rules decide first", nil},
		{"docs/runbook.md", "Old rules", "metadata.name=ip-masq-agent", func(r docResult) bool {
			return exit0()(r) && !strings.Contains(r.stdout, "ip-masq-agent")
		}, "no original DaemonSet (and not this agent's)", nil},
		{"docs/runbook.md", "Old rules", "cleanup-iptables", tool("removed"), "the original's rules removed now", nil},
		{"docs/runbook.md", "The table is missing", "-o wide", exit0("ip-masq-agent-nft"), "the DaemonSet", nil},
		{"docs/runbook.md", "The table is missing", "--show-labels", exit0("kubernetes.io/os=linux"), "the node's labels", nil},
		{"docs/runbook.md", "The table is missing", "ip-masq-agent list", exit0("table inet ip-masq-agent"), "the kernel's table", nil},
		{"docs/runbook.md", "The table is missing", "--previous", previous, "no crash before this start", nil},
		{"docs/runbook.md", "Agent down", "get pods -l", exit0("ip-masq-agent-nft-", "Running"), "the agent's pod on the node", nil},
		{"docs/runbook.md", "Agent down", "Last State", exit0("Running"), "its state", nil},
	}
	for _, c := range checks {
		cmd, err := d.find(c.file, c.section, c.words)
		if err != nil {
			s.assert(false, "%v", err)
			continue
		}
		if c.before != nil {
			if err := c.before(); err != nil {
				return err
			}
		}
		r := d.runChecked(cmd, c.check, c.what)
		if strings.Contains(cmd.text, "cleanup-iptables") && r.code == 0 {
			h, jump := s.originalState(s.ctx)
			s.assert(h == "" && !jump, "after the runbook's cleanup-iptables the node holds neither the original's chain %s nor its jump (rules %q, jump %v)", originalChain, h, jump)
		}
	}
	// Every command of the runbook runs here (or is listed as not run).
	for _, c := range d.section("docs/runbook.md", "") {
		if !d.ran[c.text] && docNotRun[c.text] == "" {
			s.assert(false, "%s: not run by the runbook step, not listed as not run", c)
		}
	}
	return nil
}

// writeOriginalOnce writes the original agent's rules into the node once,
// with its stand-in (as a node whose old agent stopped less than 2 x
// resyncInterval + 5 s ago holds them).
func (s *suite) writeOriginalOnce() error {
	_, err := run(s.ctx, time.Minute, "nsenter", "--net="+s.n.nodeNS, "--", s.n.path("bin", "original"), "-once", "-masq-chain="+originalChain, "-config="+s.n.path("operator", "config"))
	if err != nil {
		return err
	}
	h, jump := s.originalState(s.ctx)
	s.assert(h != "" && jump, "the original's chain %s (rules %s) and its jump written once, for the runbook's \"Old rules never go away\": %v", originalChain, h, jump)
	return nil
}

// writeAddonOnce writes the original's rules as the Kubernetes addon runs
// it without a ConfigMap, for the runbook's "The switch changed decisions".
func (s *suite) writeAddonOnce() error {
	args := append([]string{"-once", "-config=" + s.n.path("precheck", "no-config")}, addonArgs...)
	if out, err := run(s.ctx, time.Minute, "nsenter", append([]string{"--net=" + s.n.nodeNS, "--", s.n.path("bin", "original")}, args...)...); err != nil {
		return fmt.Errorf("the stand-in original -once: %v: %s", err, out)
	}
	return nil
}

// badCIDR is the runbook's bad-config step's mistake: not a CIDR.
const badCIDR = "10.0.0.0/88"

// badConfigMap applies the changed ConfigMap with a bad CIDR added (as an
// operator's edit would), and waits for the agent's pod to turn NotReady
// (readiness probe every 5 s, 3 failures): the agent refuses it and keeps
// the last good table.
func (s *suite) badConfigMap() error {
	bad := strings.Replace(changedConfigMap(), "      - 203.0.113.0/24\n", "      - 203.0.113.0/24\n      - "+badCIDR+"\n", 1)
	path := s.n.path("manifests", "bad.yaml")
	if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
		return err
	}
	s.logf("the runbook's bad-config procedure: kubectl apply of the changed ConfigMap with %s added", badCIDR)
	if out, err := s.kubectlAll(time.Minute, "apply", "-f", path); err != nil {
		return fmt.Errorf("apply the bad ConfigMap: %v: %s", err, out)
	}
	err := waitFor(s.ctx, "the agent's pod NotReady after the bad ConfigMap", 3*time.Minute, time.Second, func() (bool, string, error) {
		pods, err := s.agentPods()
		return err == nil && len(pods) == 1 && strings.Contains(pods[0], " False "), strings.Join(pods, "; "), err
	})
	s.assert(err == nil, "the bad ConfigMap makes the agent's pod NotReady: %v", err)
	return nil
}

// fixCMYAML is the operator's edit of the runbook's cm.yaml: the bad CIDR
// the log line named is removed (the last-applied annotation, one line,
// keeps it until kubectl apply rewrites it).
func (d *docShell) fixCMYAML() error {
	path := filepath.Join(d.dir, "cm.yaml")
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var kept []string
	removed := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.TrimSpace(l) == "- "+badCIDR {
			removed++
			continue
		}
		kept = append(kept, l)
	}
	d.s.assert(removed == 1, "cm.yaml, as the runbook fetches it, holds the bad CIDR %s once in the config (%d)", badCIDR, removed)
	return os.WriteFile(path, []byte(strings.Join(kept, "\n")), 0o644)
}

// waitRecovered waits for the fixed config to reach the agent (the
// kubelet's sync, then the file event): its recovery line and Ready.
func (s *suite) waitRecovered() error {
	err := waitFor(s.ctx, "the agent's recovery from the bad ConfigMap", 3*time.Minute, time.Second, func() (bool, string, error) {
		pods, err := s.agentPods()
		if err != nil || len(pods) != 1 || !strings.Contains(pods[0], " True ") {
			return false, strings.Join(pods, "; "), err
		}
		name := strings.Fields(pods[0])[0]
		log, err := s.kubectl(30*time.Second, "-n", "kube-system", "logs", name)
		return err == nil && strings.Contains(log, "config is good again"), pods[0], err
	})
	s.assert(err == nil, "the fixed ConfigMap: the agent logs its recovery and is Ready again: %v", err)
	return nil
}

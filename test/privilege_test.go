package test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// Capability sets for setpriv (util-linux), applied after `ip netns exec`
// has entered the node namespace: as a container runtime does, the agent
// starts with its capabilities already reduced. --no-new-privs is the
// DaemonSet's allowPrivilegeEscalation: false.
var (
	rootNetAdmin = []string{"--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all,+net_admin", "--no-new-privs"}
	userNetAdmin = []string{"--reuid=65534", "--regid=65534", "--clear-groups",
		"--inh-caps=-all,+net_admin", "--ambient-caps=-all,+net_admin", "--bounding-set=-all,+net_admin", "--no-new-privs"}
	rootNoCaps = []string{"--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all", "--no-new-privs"}
	userNoCaps = []string{"--reuid=65534", "--regid=65534", "--clear-groups",
		"--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all", "--no-new-privs"}
)

// privileged runs a command in the node namespace under setpriv.
func privileged(topo *testnet.Topology, caps []string, args ...string) *exec.Cmd {
	return nodeCommand(topo, "setpriv", append(append(append([]string{}, caps...), "--"), args...)...)
}

// readableConfig writes a config file that user nobody can read.
func readableConfig(t *testing.T, content string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "ip-masq-agent-priv-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "ip-masq-agent")
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// agentReadable copies the agent binary where user nobody can run it.
func agentReadable(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(agentBin)
	if err != nil {
		t.Fatal(err)
	}
	path := readableConfig(t, "")
	bin := filepath.Join(filepath.Dir(path), "ip-masq-agent-bin")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// TestLeastPrivilege runs the agent with CAP_NET_ADMIN and nothing else,
// as root (the DaemonSet: drop ALL, add NET_ADMIN) and as user nobody
// with NET_ADMIN as an ambient capability, once and as a daemon that
// watches, repairs and serves its endpoint; and without CAP_NET_ADMIN,
// where it must fail at once with one clear line.
func TestLeastPrivilege(t *testing.T) {
	testnet.Require(t, "setpriv", "grep")
	topo := newTopology(t)
	addDestinations(t, topo, internet1, private1)
	bin := agentReadable(t)
	cfg := readableConfig(t, "resyncInterval: 1h\nnonMasqueradeCIDRs: [10.0.0.0/8]\n")

	for _, tc := range []struct {
		name string
		caps []string
	}{{"root with CAP_NET_ADMIN only", rootNetAdmin}, {"nobody with ambient CAP_NET_ADMIN", userNetAdmin}} {
		t.Run(tc.name+": --once", func(t *testing.T) {
			out, err := privileged(topo, tc.caps, "grep", "^Cap", "/proc/self/status").CombinedOutput()
			if err != nil || !strings.Contains(string(out), "CapEff:\t0000000000001000") {
				t.Fatalf("setpriv %s does not give CAP_NET_ADMIN alone: %v\n%s", strings.Join(tc.caps, " "), err, out)
			}
			if _, err := runAgent(t, topo, "--cleanup"); err != nil {
				t.Fatal(err)
			}
			out, err = privileged(topo, tc.caps, bin, "--once", "--config", cfg).CombinedOutput()
			if err != nil {
				t.Fatalf("with CAP_NET_ADMIN only: %v\n%s", err, out)
			}
			expectSources(t, topo, map[string]bool{internet1: true, private1: false})
		})
	}

	t.Run("daemon as nobody with ambient CAP_NET_ADMIN", func(t *testing.T) {
		if _, err := runAgent(t, topo, "--cleanup"); err != nil {
			t.Fatal(err)
		}
		d := startCommand(t, privileged(topo, userNetAdmin, bin, "--v=2", "--config", cfg, "--own-table=false"), false)
		eventually(t, "/readyz", func() bool { code, _ := httpGet(topo, "/readyz"); return code == 200 })
		expectSources(t, topo, map[string]bool{internet1: true, private1: false})
		status, err := os.ReadFile("/proc/" + strconv.Itoa(d.Cmd.Process.Pid) + "/status")
		if err != nil || !strings.Contains(string(status), "CapEff:\t0000000000001000") || !strings.Contains(string(status), "Uid:\t65534") {
			t.Errorf("the daemon does not run as nobody with CAP_NET_ADMIN alone:\n%s", status)
		}
		// The watch (multicast group, forced receive buffer) works: a
		// foreign change is undone.
		if out, err := topo.NFT("flush", "chain", "inet", nft.TableName, nft.DefaultChain); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		eventually(t, "the repair", func() bool { return strings.Contains(d.output(), repairLine) })
		expectSources(t, topo, map[string]bool{internet1: true, private1: false})
		if strings.Contains(d.output(), "level=ERROR") {
			t.Errorf("errors with CAP_NET_ADMIN:\n%s", d.output())
		}
		t.Logf("as uid 65534 with CapEff=CAP_NET_ADMIN only (no-new-privs): applied, served /readyz on 127.0.0.1:9753, " +
			"watched and repaired a foreign change, with no error logged")
	})

	for _, tc := range []struct {
		name string
		caps []string
		args []string
	}{
		{"root without capabilities: --once", rootNoCaps, []string{"--once", "--config", cfg}},
		{"nobody without capabilities: --once", userNoCaps, []string{"--once", "--config", cfg}},
		{"root without capabilities: --cleanup", rootNoCaps, []string{"--cleanup"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if out, err := runAgent(t, topo, "--once", "--config", cfg); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			before := listTable(t, topo)
			out, err := privileged(topo, tc.caps, append([]string{bin}, tc.args...)...).CombinedOutput()
			checkNoPrivilegeFailure(t, out, err)
			t.Logf("without CAP_NET_ADMIN: %v; the one error line: %s", err, lineWith(string(out), "level=ERROR"))
			if after := listTable(t, topo); withoutCounters(after) != withoutCounters(before) {
				t.Errorf("the table changed:\n%s", after)
			}
		})
	}

	t.Run("daemon without capabilities fails at start", func(t *testing.T) {
		cmd := privileged(topo, rootNoCaps, bin, "--config", cfg, "--http-address=127.0.0.1:0")
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			checkNoPrivilegeFailure(t, []byte(out.String()), err)
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Errorf("the daemon was still running 10s after start without CAP_NET_ADMIN:\n%s", out.String())
		}
	})
}

// checkNoPrivilegeFailure: a non-zero exit, one error line that names
// CAP_NET_ADMIN, no panic or stack trace.
func checkNoPrivilegeFailure(t *testing.T, out []byte, err error) {
	t.Helper()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Errorf("without CAP_NET_ADMIN: %v, want a non-zero exit\n%s", err, out)
	}
	s := string(out)
	if n := strings.Count(s, "level=ERROR"); n != 1 {
		t.Errorf("%d error lines, want 1:\n%s", n, s)
	}
	if line := lineWith(s, "level=ERROR"); !strings.Contains(line, "CAP_NET_ADMIN") || !strings.Contains(line, "operation not permitted") {
		t.Errorf("the error line does not say that CAP_NET_ADMIN is missing: %s", line)
	}
	for _, bad := range []string{"panic", "goroutine ", ".go:"} {
		if strings.Contains(s, bad) {
			t.Errorf("the output holds %q (a stack trace?):\n%s", bad, s)
		}
	}
	if ws, ok := exitStatus(err); ok && ws.Signaled() {
		t.Errorf("killed by a signal: %v", ws.Signal())
	}
}

func exitStatus(err error) (syscall.WaitStatus, bool) {
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		ws, ok := exit.Sys().(syscall.WaitStatus)
		return ws, ok
	}
	return 0, false
}

// Package test holds the end-to-end tests: the agent against the real
// kernel, in network namespaces each test creates and deletes, proven with
// packets and read back with the real nft CLI.
package test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
)

// agentBin is the agent built once for all tests.
var agentBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "ip-masq-agent-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	agentBin = filepath.Join(dir, "ip-masq-agent")
	if prebuilt := os.Getenv("IP_MASQ_AGENT_BIN"); prebuilt != "" {
		// A test binary built with go test -c, run where there is no Go
		// toolchain (make test-kernels' guests): the agent built beside it.
		agentBin = prebuilt
	} else {
		build := exec.Command("go", "build", "-o", agentBin, "../cmd/ip-masq-agent")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build the agent: %v\n%s", err, out)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// newTopology is testnet.New with the privilege check and cleanup.
func newTopology(t *testing.T) *testnet.Topology {
	t.Helper()
	testnet.Require(t, "ip", "nft")
	name := strings.NewReplacer("/", "-", "_", "-").Replace(t.Name())
	if len(name) > 12 {
		name = name[len(name)-12:]
	}
	topo, err := testnet.New(strings.Trim(name, "-"))
	if err != nil {
		t.Fatalf("create namespaces: %v", err)
	}
	t.Cleanup(func() {
		if err := topo.Close(); err != nil {
			t.Errorf("delete namespaces: %v", err)
		}
	})
	return topo
}

// writeConfig writes a config file for the agent and returns its path.
func writeConfig(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ip-masq-agent")
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// runAgent runs the agent binary in the node namespace and returns its
// output and exit error.
func runAgent(t *testing.T, topo *testnet.Topology, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := topo.RunInNode(ctx, agentBin, args...)
	return string(out), err
}

// mustApply runs `ip-masq-agent --once` with the config and flags.
func mustApply(t *testing.T, topo *testnet.Topology, cfg string, flags ...string) {
	t.Helper()
	args := append([]string{"--once", "--config", writeConfig(t, cfg)}, flags...)
	if out, err := runAgent(t, topo, args...); err != nil {
		t.Fatalf("ip-masq-agent %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// listTable is `nft list table inet ip-masq-agent` in the node namespace.
func listTable(t *testing.T, topo *testnet.Topology, extra ...string) string {
	t.Helper()
	out, err := topo.NFT(append(extra, "list", "table", "inet", "ip-masq-agent")...)
	if err != nil {
		t.Fatalf("nft list table: %v\n%s", err, out)
	}
	return out
}

var countersRE = regexp.MustCompile(`counter packets \d+ bytes \d+`)

var tableFlagsRE = regexp.MustCompile(`(?m)^\tflags [a-z, ]*\n(\n)?| # progname \S+`)

// withoutCounters drops counter values, which traffic changes, and the
// table's flags and owner, which say which process owns it; and puts the
// sets and chains in name order (nft lists them in the order they were
// made, and a repair re-makes only what it replaces).
func withoutCounters(s string) string {
	s = tableFlagsRE.ReplaceAllString(countersRE.ReplaceAllString(s, "counter"), "")
	var out []string
	for _, table := range strings.SplitAfter(s, "\n}\n") {
		head, body, ok := strings.Cut(table, "{\n")
		if !ok {
			out = append(out, table)
			continue
		}
		body, tail, _ := strings.Cut(body, "\n}\n")
		blocks := strings.Split(body, "\n\n")
		slices.Sort(blocks)
		out = append(out, head+"{\n"+strings.Join(blocks, "\n\n")+"\n}\n"+tail)
	}
	return strings.Join(out, "")
}

// expectSources sends a new TCP connection to each destination and checks
// the source address it arrives with: the node's (masqueraded) or the pod's.
func expectSources(t *testing.T, topo *testnet.Topology, masqueraded map[string]bool) {
	t.Helper()
	for dst, masq := range masqueraded {
		addr := netip.MustParseAddr(dst)
		want, how := topo.Pod4, "the pod's address (not masqueraded)"
		if addr.Is6() {
			want = topo.Pod6
		}
		if masq {
			want, how = topo.NodeUplink4, "the node's address (masqueraded)"
			if addr.Is6() {
				want = topo.NodeUplink6
			}
		}
		got, err := topo.SourceSeen(addr)
		if err != nil {
			t.Errorf("connect to %s: %v", dst, err)
			continue
		}
		if got != want {
			t.Errorf("%s saw source %s, want %s, %s", dst, got, want, how)
		}
	}
}

// addDestinations makes each address a host in the external namespace
// (node-local addresses are skipped: they are already there).
func addDestinations(t *testing.T, topo *testnet.Topology, addrs ...string) {
	t.Helper()
	for _, a := range addrs {
		addr := netip.MustParseAddr(a)
		if addr == topo.NodePodSide4 || addr == topo.NodePodSide6 {
			continue
		}
		if err := topo.AddDestination(addr); err != nil {
			t.Fatalf("add destination %s: %v", a, err)
		}
	}
}

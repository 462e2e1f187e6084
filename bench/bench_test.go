package bench

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// TestQuickRun runs every part of the harness with tiny sizes (the run of
// BENCH_QUICK=1 make bench) and checks that it produces figures and a
// report. It asserts nothing about the figures themselves: timings on a
// shared machine prove nothing in a test.
func TestQuickRun(t *testing.T) {
	// Every tool the report compares the agent with (a missing one would
	// leave its row out, quietly).
	testnet.Require(t, "ip", "nft", "iptables-nft", "iptables-nft-restore", "ip6tables-nft", "ip6tables-nft-restore",
		"iptables-legacy", "iptables-legacy-restore", "ip6tables-legacy", "ip6tables-legacy-restore")
	agent := filepath.Join(t.TempDir(), "ip-masq-agent")
	build := exec.Command("go", "build", "-o", agent, "../cmd/ip-masq-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the agent: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var log strings.Builder
	r := Run(ctx, Config{Agent: agent, Quick: true, Log: &log})
	t.Logf("progress:\n%s", log.String())
	if err := r.Err(); err != nil {
		t.Fatalf("the run failed: %v", err)
	}

	if r.Control == nil || len(r.Control.Rows) == 0 {
		t.Fatal("no control plane figures")
	}
	for _, row := range r.Control.Rows {
		for s := range numScenarios {
			if row.Times[0][s].Reps() == 0 || row.Times[0][s].Median() <= 0 {
				t.Errorf("IPv%d %d CIDRs: no agent time for %s", row.Family, row.N, Scenario(s))
			}
		}
		if len(row.Skipped) > 0 {
			t.Errorf("IPv%d %d CIDRs: not measured: %q", row.Family, row.N, row.Skipped)
		}
		if row.Times[1][First].Reps() == 0 {
			t.Errorf("IPv%d %d CIDRs: no nft -f time", row.Family, row.N)
		}
		if len(row.RSS) == 0 || row.RSS[0] <= 0 {
			t.Errorf("IPv%d %d CIDRs: no peak RSS of the binary", row.Family, row.N)
		}
	}

	if r.Data == nil {
		t.Fatal("no data plane figures")
	}
	for _, p := range r.Data.Points {
		if p.Skipped != "" {
			t.Logf("%s: skipped: %s", p.Label(), p.Skipped)
			continue
		}
		if !p.Measured() || p.Rate() <= 0 || p.CPUns() <= 0 {
			t.Errorf("%s: no rate or CPU figure", p.Label())
		}
		if p.Conns > 0 && p.wrongNAT() > 0 {
			t.Errorf("%s: %d connections with the wrong source address (masqueraded %d, direct %d)", p.Label(), p.wrongNAT(), p.Masq, p.Direct)
		}
	}
	for _, kind := range []string{KindNone, KindConntrack, KindAgent} {
		found := false
		for _, p := range r.Data.Points {
			found = found || (p.Kind == kind && p.Measured())
		}
		if !found {
			t.Errorf("no measured data plane point for %s", kind)
		}
	}

	if s := r.Selectors; s == nil {
		t.Error("no figures with every selector")
	} else {
		for _, p := range s.Data.Points {
			if !p.Measured() || p.wrongNAT() > 0 {
				t.Errorf("every selector: %s: measured %v, %d connections with the wrong source address (%s)", p.Label(), p.Measured(), p.wrongNAT(), seenCell(p))
			}
		}
		if !s.Constant() {
			t.Errorf("every selector: the rules grow with the lists: %+v", s.Rules)
		}
		// The kernel holds Build's rules and the base chain's one.
		if got, want := s.KernelRules[KindAgentSelectors], s.Rules[0].Decision+s.Rules[0].Masq+1; got != want {
			t.Errorf("every selector: %d rules in the kernel, want %d", got, want)
		}
	}

	if r.Live == nil || len(r.Live.Rows) == 0 {
		t.Fatal("no live operation figures")
	}
	for _, row := range r.Live.Rows {
		if len(row.Reload) == 0 || (len(row.Repair) == 0 && !row.Neighbour) {
			t.Errorf("%d CIDRs: reload trials %d (timed out %d), repair trials %d (timed out %d)",
				row.N, len(row.Reload), row.ReloadFailed, len(row.Repair), row.RepairFailed)
		}
		if !row.Neighbour && len(row.RepairFloor) != len(row.Repair)+row.RepairFailed {
			t.Errorf("%d CIDRs: %d repair trials, %d of the kernel's floor %v", row.N, len(row.Repair)+row.RepairFailed, len(row.RepairFloor), row.RepairFloor)
		}
	}

	if r.Busy == nil || len(r.Busy.Rows) == 0 {
		t.Error("no busy node figures")
	} else {
		for _, x := range r.Busy.Rows {
			if len(x.Changes) == 0 || x.Probes == 0 {
				t.Errorf("busy node, %d CIDRs, %s: %d changes measured, %d probes", x.N, ownedName(x.Owned), len(x.Changes), x.Probes)
			}
			if x.NFT && len(x.Ready) != len(x.Changes) {
				t.Errorf("busy node, %d CIDRs, %s, an nft neighbour: %d changes, %d times to ready", x.N, ownedName(x.Owned), len(x.Changes), len(x.Ready))
			}
		}
	}

	if r.Neighbour == nil || len(r.Neighbour.Rows) == 0 {
		t.Error("no figures of the node's other nft users")
	} else {
		for _, x := range r.Neighbour.Rows {
			if len(x.BeforeWall) == 0 || len(x.AfterWall) == 0 || len(x.EmptyWall) == 0 || x.After > x.Before {
				t.Errorf("neighbour, %d CIDRs: %d/%d/%d batches timed, %d elements merged, %d as written", x.N,
					len(x.EmptyWall), len(x.BeforeWall), len(x.AfterWall), x.After, x.Before)
			}
		}
	}

	if r.ChangeCPU == nil || len(r.ChangeCPU.Rows) == 0 {
		t.Error("no figures of the agent's CPU per change")
	} else {
		for _, x := range r.ChangeCPU.Rows {
			if len(x.CPU) == 0 || len(x.Resync) == 0 {
				t.Errorf("CPU per change, %d CIDRs: %d changes, %d resyncs measured", x.N, len(x.CPU), len(x.Resync))
			}
			// The floor of each change: the bare commit's CPU and, with
			// the cleanup, the conntrack dump's.
			if len(x.Commit) != len(x.CPU) || (x.Flag != noCleanup) != (len(x.Dump) == len(x.CPU)) || len(x.Own()) != len(x.CPU) {
				t.Errorf("CPU per change, %d CIDRs %s: the kernel's floor: commits %v, dumps %v", x.N, x.Flag, x.Commit, x.Dump)
			}
		}
	}

	if k := r.Kernel; k == nil {
		t.Error("no kernel side figures")
	} else {
		for _, x := range k.ReadBack {
			if x.Read.Reps() == 0 || x.CachedRead.Reps() == 0 || x.Resync.Reps() == 0 {
				t.Errorf("%d CIDRs: no read-back figures", x.N)
			}
			if x.Sent != 0 || x.GenMoves != 0 || x.NotUnchanged != 0 {
				t.Errorf("%d CIDRs: unchanged resyncs sent %d messages, moved the generation %d times, %d not unchanged", x.N, x.Sent, x.GenMoves, x.NotUnchanged)
			}
		}
		if len(k.Once) == 0 || len(k.Once[0].Wall) == 0 || k.daemon() == nil {
			t.Error("no --once or daemon first apply figures")
		}
		if len(k.Restarts) != 2 {
			t.Errorf("restarts measured: %d configurations, want 2", len(k.Restarts))
		}
		for _, x := range k.Restarts {
			if len(x.Messages) == 0 || x.NotRecognised > 0 {
				t.Errorf("restarts (owned %v): %d measured, %d did not find the table", x.Owned, len(x.Messages), x.NotRecognised)
			}
		}
	}
	if c := r.Conntrack; c == nil || len(c.Rows) == 0 || len(c.Rows[0].Took) == 0 {
		t.Error("no conntrack cleanup figures")
	} else if x := c.Rows[0]; x.Wrong != "" || x.Probe.Sent == 0 {
		t.Errorf("conntrack cleanup: %s; probe %+v", x.Wrong, x.Probe)
	}

	md := Markdown(r)
	for _, want := range []string{"## Machine", "## Targets", "## Control plane", "## Kernel side", "## Data plane", "## Data plane with every selector", "## Live operation", "## Conntrack cleanup", "## Rerun"} {
		if !strings.Contains(md, want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	if len(Targets(r)) == 0 {
		t.Error("no targets evaluated")
	}
	// Nothing left behind.
	if entries, err := os.ReadDir("/run/netns"); err == nil {
		for _, e := range entries {
			if m := staleRE.FindStringSubmatch(e.Name()); m != nil && m[1] == strconv.Itoa(os.Getpid()) {
				t.Errorf("namespace %s left behind", e.Name())
			}
		}
	}
}

// TestCIDRLists checks the synthesized lists: the sizes asked for, no
// overlaps, and none covering the data plane's destination.
func TestCIDRLists(t *testing.T) {
	for _, family := range []int{4, 6} {
		n := 100_000
		if family == 6 {
			n = 10_000
		}
		a, b := cidrList(family, 0, n), cidrList(family, 1, n)
		if len(a) != n || len(b) != n {
			t.Fatalf("IPv%d: %d and %d CIDRs, want %d", family, len(a), len(b), n)
		}
		all := append(append(a, b...), oneChanged(family, a)[n/2])
		// Normalize drops duplicates and CIDRs contained in others.
		if got := len(nft.Normalize(all)); got != len(all) {
			t.Fatalf("IPv%d: the lists overlap (%d distinct of %d)", family, got, len(all))
		}
		for _, p := range all {
			for _, dst := range []netip.Addr{dataDst, netip.MustParseAddr("10.244.1.2"), netip.MustParseAddr("192.0.2.1")} {
				if p.Contains(dst) {
					t.Fatalf("%s covers %s", p, dst)
				}
			}
		}
	}
}

// TestAWSShaped checks the cloud-shaped lists of the neighbour part: the
// size asked for, mostly runs of adjacent prefixes, which merging
// shrinks, and none covering the harness's addresses.
func TestAWSShaped(t *testing.T) {
	for _, n := range []int{64, 7_905, 100_000} {
		ps := awsShaped(n)
		if len(ps) != n {
			t.Fatalf("%d CIDRs, want %d", len(ps), n)
		}
		after, before := elementsOf(ps)
		a, b := elementCount(after), elementCount(before)
		t.Logf("%d CIDRs: %d elements as the agent writes them, %d merged", n, b, a)
		if b >= n+1 || a >= b*2/3 {
			t.Errorf("%d CIDRs: %d elements as written, %d merged: not the shape of a cloud list", n, b, a)
		}
		for _, p := range ps {
			for _, dst := range []netip.Addr{dataDst, netip.MustParseAddr("10.244.1.2"), netip.MustParseAddr("192.0.2.1")} {
				if p.Contains(dst) {
					t.Fatalf("%s covers %s", p, dst)
				}
			}
		}
	}
}

package test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/harness"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft/kernel"
)

// configMapDir is a test's ConfigMap volume, updated the kubelet's way.
type configMapDir struct {
	t *testing.T
	*harness.Volume
}

// newConfigMapDir is a volume with one key, ip-masq-agent.
func newConfigMapDir(t *testing.T, content string) *configMapDir {
	return newProjectedDir(t, map[string]string{configFile: content})
}

// newProjectedDir is a volume with files (key: content).
func newProjectedDir(t *testing.T, files map[string]string) *configMapDir {
	t.Helper()
	v, err := harness.NewVolume(t.TempDir(), files)
	if err != nil {
		t.Fatal(err)
	}
	return &configMapDir{t: t, Volume: v}
}

func (d *configMapDir) path() string { return d.Path(configFile) }

// update swaps the key's new content in (the kubelet's AtomicWriter).
func (d *configMapDir) update(content string) { d.updateFiles(map[string]string{configFile: content}) }

// updateFiles swaps the keys' new contents in.
func (d *configMapDir) updateFiles(files map[string]string) {
	d.t.Helper()
	if _, err := d.Update(files); err != nil {
		d.t.Fatal(err)
	}
}

// place swaps in a key that place(path) puts in the new directory (a
// symlink, a fifo ...) instead of content.
func (d *configMapDir) place(place func(path string) error) {
	d.t.Helper()
	if _, err := d.Place(configFile, place); err != nil {
		d.t.Fatal(err)
	}
}

// daemon is the agent running in the node namespace until the test ends.
type daemon struct{ *harness.Daemon }

// output is the agent's log so far.
func (d *daemon) output() string { return d.Output() }

func startDaemon(t *testing.T, topo *testnet.Topology, args ...string) *daemon {
	t.Helper()
	return startDaemonIn(t, topo, nil, args...)
}

// startDaemonIn starts the agent under wrap (e.g. unshare --pid --fork: the
// agent as PID 1, as in its container).
func startDaemonIn(t *testing.T, topo *testnet.Topology, wrap []string, args ...string) *daemon {
	t.Helper()
	argv := append(append([]string{"netns", "exec", topo.NodeNS}, wrap...), append([]string{agentBin, "--v=2"}, args...)...)
	return startCommand(t, exec.Command("ip", argv...), len(wrap) > 0)
}

// startCommand starts cmd, which runs the agent; wrapped: under unshare
// --fork --kill-child=SIGTERM, which ignores SIGTERM itself.
func startCommand(t *testing.T, cmd *exec.Cmd, wrapped bool) *daemon {
	t.Helper()
	d := &daemon{harness.New(cmd)}
	d.KillToStop = wrapped
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.stop(t)
		if t.Failed() {
			t.Logf("agent log:\n%s", d.output())
		}
	})
	return d
}

// stop sends SIGTERM and waits (at most 10s) for a clean exit; an agent
// that has exited already is left to the test.
func (d *daemon) stop(t *testing.T) {
	t.Helper()
	select {
	case <-d.Exited():
		return
	default:
	}
	switch err := d.Stop(); {
	case errors.Is(err, harness.ErrNoExit):
		t.Errorf("the agent did not exit within 10s of SIGTERM")
	case err != nil && !d.KillToStop:
		t.Errorf("the agent exited with %v after SIGTERM", err)
	}
}

// eventually polls cond for up to 20s: waiting on a condition, not
// asserting how fast it became true.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	harness.Eventually(t, 20*time.Second, what, cond)
}

// notOwnedDaemon is a topology with internet1 (masqueraded) and private1,
// and the agent on config (resyncInterval: 1h: a repair comes from the
// watch), with its table not owned (others may change it), in force and
// its first apply logged: it returns the table as the agent wrote it
// (withoutCounters).
func notOwnedDaemon(t *testing.T, config string) (*testnet.Topology, *daemon, string) {
	t.Helper()
	topo := newTopology(t)
	addDestinations(t, topo, internet1, private1)
	cm := newConfigMapDir(t, config)
	d := startDaemon(t, topo, "--config", cm.path(), "--http-address=127.0.0.1:0", "--own-table=false")
	eventually(t, "the rules", sourcesAre(topo, map[string]bool{internet1: true, private1: false}))
	// The first apply reads its commit back: a tamper before that read is
	// put back by the apply itself (a repair by=apply), not by the watch
	// or the resync that the callers test. Wait for the watch too.
	waitStarted(t, d)
	return topo, d, withoutCounters(listTable(t, topo))
}

func sourcesAre(topo *testnet.Topology, want map[string]bool) func() bool {
	return func() bool {
		for dst, masq := range want {
			got, err := topo.SourceSeen(mustParse(dst))
			if err != nil || (got == topo.NodeUplink4) != masq {
				return false
			}
		}
		return true
	}
}

// TestDaemonReloads: the daemon, with a resync interval of an hour, picks
// up a ConfigMap update done the kubelet's way, the deletion of the file
// (defaults) and its re-creation, from file events alone.
func TestDaemonReloads(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, internet1, private1)
	cm := newConfigMapDir(t, "resyncInterval: 1h\nnonMasqueradeCIDRs: [203.0.113.0/24]\n")
	d := startDaemon(t, topo, "--config", cm.path(), "--http-address=127.0.0.1:0")
	eventually(t, "the first config", sourcesAre(topo, map[string]bool{internet1: false, private1: true}))

	cm.update("resyncInterval: 1h\nnonMasqueradeCIDRs: [10.0.0.0/8]\n")
	eventually(t, "the ConfigMap update", sourcesAre(topo, map[string]bool{internet1: true, private1: false}))

	cm.update("resyncInterval: 1h\nmasqueradeCIDRs: [10.250.0.0/16]\n")
	eventually(t, "the second update", sourcesAre(topo, map[string]bool{internet1: true, private1: true}))

	// The file goes away (the ConfigMap was deleted): defaults.
	os.Remove(cm.path())
	eventually(t, "the defaults after deletion", sourcesAre(topo, map[string]bool{internet1: true, private1: false}))
	if err := os.WriteFile(cm.path(), []byte("resyncInterval: 1h\nnonMasqueradeCIDRs: [203.0.113.0/24]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the re-created file", sourcesAre(topo, map[string]bool{internet1: false, private1: true}))

	// A bad update is refused and logged; the rules stay. It is written
	// whole in one step (a rename, as an editor's atomic save): the
	// truncation os.WriteFile starts with is an empty file, whose defaults
	// an agent that reads in between rightly applies (met on 6.1 under
	// TCG, where the write came 0.5 s after the truncation).
	before := withoutCounters(listTable(t, topo))
	if err := os.WriteFile(cm.path()+".new", []byte("nonMasqueradeCIDRs: [10.0.0.1/8]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(cm.path()+".new", cm.path()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the error to be logged", func() bool { return strings.Contains(d.output(), `10.0.0.1/8`) })
	if after := withoutCounters(listTable(t, topo)); after != before {
		t.Errorf("a bad config changed the table:\n%s", after)
	}
	if n := strings.Count(d.output(), "level=ERROR"); n != 1 {
		t.Errorf("%d error lines for one bad config, want 1:\n%s", n, d.output())
	}
}

// TestDaemonRepairs: changes by another process are undone, and counters
// survive resyncs that find nothing to change.
func TestDaemonRepairs(t *testing.T) {
	topo, d, want := notOwnedDaemon(t, "resyncInterval: 1s\n")

	for i, tamper := range [][]string{
		{"delete", "table", "inet", "ip-masq-agent"},
		{"flush", "chain", "inet", "ip-masq-agent", "IP-MASQ-AGENT"},
		{"add", "element", "inet", "ip-masq-agent", "nonmasq-v4", "{ 203.0.113.0/24 }"},
		{"insert", "rule", "inet", "ip-masq-agent", "IP-MASQ-AGENT", "ip daddr 10.250.0.10 goto masq-to-node"},
	} {
		if out, err := topo.NFT(tamper...); err != nil {
			t.Fatalf("nft %v: %v %s", tamper, err, out)
		}
		eventually(t, "the repair of nft "+strings.Join(tamper, " "), func() bool {
			out, err := topo.NFT("list", "table", "inet", "ip-masq-agent")
			return err == nil && withoutCounters(out) == want
		})
		// Each repair is logged after its commit and the read-back, which
		// the listing may see first; the next change waits for it (or the
		// read-back finds it and the same repair undoes both).
		eventually(t, fmt.Sprintf("%d repairs logged", i+1), func() bool { return strings.Count(d.output(), repairLine) >= i+1 })
		expectSources(t, topo, map[string]bool{internet1: true, private1: false})
	}

	// Counters keep counting across resyncs that change nothing.
	expectSources(t, topo, map[string]bool{internet1: true})
	counted := listTable(t, topo)
	resyncs := strings.Count(d.output(), "nothing sent")
	eventually(t, "two more resyncs", func() bool { return strings.Count(d.output(), "nothing sent") >= resyncs+2 })
	if got := listTable(t, topo); got != counted {
		t.Errorf("unchanged resyncs changed the table (counters reset?):\nbefore:\n%s\nafter:\n%s", counted, got)
	}
}

// TestDaemonRestartKeepsTable: an agent that exits without releasing its
// table (killed, or --release-on-exit=false) leaves the rules in place,
// orphaned, and a new agent takes the table over in place: the table is
// never deleted. (With the default flags the exiting agent re-creates it
// unowned, in one transaction, and the next re-creates it owned:
// TestSavedRulesetLoads.)
func TestDaemonRestartKeepsTable(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, internet1, private1)
	cm := newConfigMapDir(t, "")
	first := startDaemon(t, topo, "--config", cm.path(), "--http-address=127.0.0.1:0", "--release-on-exit=false")
	eventually(t, "the rules", sourcesAre(topo, map[string]bool{internet1: true, private1: false}))

	// An independent observer of every transaction in the namespace.
	observer := &kernel.Netlink{NetNS: int(topo.NodeHandle()), NoOwner: true}
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var seen []string
	watched := make(chan error, 1)
	subscribed := make(chan struct{})
	go func() {
		watched <- observer.Watch(ctx, func(c nft.Event) {
			if c.What == "watch started" {
				close(subscribed)
				return
			}
			mu.Lock()
			seen = append(seen, c.What)
			mu.Unlock()
		})
	}()
	select {
	case <-subscribed:
	case err := <-watched:
		t.Fatalf("the observer's watch: %v", err)
	}

	first.stop(t)
	if !strings.Contains(listTable(t, topo), "jump IP-MASQ-AGENT") {
		t.Fatal("the table is gone after SIGTERM")
	}
	expectSources(t, topo, map[string]bool{internet1: true, private1: false})
	// Every counter, and every handle, as the first agent left them.
	// (The owner's name, progname, is the only difference nft may show.)
	owner := regexp.MustCompile(`(?m)^(table .*) progname \S+$`)
	listing := func() string {
		return owner.ReplaceAllString(tableFlagsRE.ReplaceAllString(listTable(t, topo, "-a"), ""), "$1")
	}
	before := listing()
	if !regexp.MustCompile(`counter packets [1-9]`).MatchString(before) {
		t.Fatalf("no counted packet before the restart:\n%s", before)
	}
	second := startDaemon(t, topo, "--config", cm.path(), "--http-address=127.0.0.1:0")
	eventually(t, "the new agent's first sync", func() bool {
		o := second.output()
		return strings.Contains(o, "took it over") || outcomeRE.MatchString(o)
	})
	if after := listing(); after != before {
		t.Errorf("the restart changed the table (handles or counters):\nbefore:\n%s\nafter:\n%s", before, after)
	}
	expectSources(t, topo, map[string]bool{internet1: true, private1: false})
	cancel()
	if err := <-watched; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	switch owns := kernelOwns(t, topo); {
	case owns && len(seen) == 0:
		t.Errorf("the observer saw no transaction from the new agent")
	case !owns && len(seen) != 0:
		// Not owned, nothing to adopt: the table is taken as it is.
		t.Errorf("the new agent sent %q to a table it cannot own, want nothing", seen)
	}
	for _, s := range seen {
		// Adopting the orphaned table is one table message (its owner
		// flag); nothing else may change.
		if s != "add table" {
			t.Errorf("the restart changed the table: %q", s)
		}
	}
	if !strings.Contains(second.output(), "took it over without changing its contents") {
		t.Errorf("the new agent did not take the table over as it was:\n%s", second.output())
	}
}

// TestDaemonEndpoints: /healthz, /readyz and /metrics answer with real
// values on the node's loopback.
func TestDaemonEndpoints(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, internet1, private1)
	cm := newConfigMapDir(t, "nonMasqueradeCIDRs: [10.0.0.0/8, 172.16.0.0/12]\n")
	startDaemon(t, topo, "--config", cm.path())
	eventually(t, "/readyz", func() bool { code, _ := httpGet(topo, "/readyz"); return code == 200 })
	if code, body := httpGet(topo, "/healthz"); code != 200 || !strings.HasPrefix(body, "ok") {
		t.Errorf("/healthz: %d %q", code, body)
	}
	expectSources(t, topo, map[string]bool{internet1: true, private1: false})
	_, body := httpGet(topo, "/metrics")
	for _, want := range []string{
		`ip_masq_agent_syncs_total{result="success"}`,
		`ip_masq_agent_config_loads_total{result="success"}`,
		`ip_masq_agent_cidrs{family="ipv4",kind="nonmasquerade",set="nonmasq-v4"} 2`,
		`ip_masq_agent_intervals{family="ipv4",kind="nonmasquerade",set="nonmasq-v4"} 3`,
		`ip_masq_agent_rule_packets_total{decision="masquerade",family="ipv4",reason="outbound"} 1`,
		`ip_masq_agent_rule_packets_total{decision="nonmasquerade",family="ipv4",reason="cidrs"} 1`,
		`ip_masq_agent_last_successful_sync_timestamp_seconds 1.`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", body)
	}
}

func mustParse(s string) netip.Addr { return netip.MustParseAddr(s) }

// TestDaemonMetricsLabels: /metrics of the agent in a node namespace, with
// IPv6, masqueradeCIDRs and a custom --masq-chain, after one connection to
// a destination of each decision and family: each rule's counter read from
// the kernel under the labels the README lists, the CIDR and interval
// gauges of the IPv6 and masquerade sets, and no read error.
func TestDaemonMetricsLabels(t *testing.T) {
	topo := newTopology(t)
	const (
		masqCIDR4 = "10.251.0.10"
		outbound6 = "2001:db8:cc::10"
	)
	addDestinations(t, topo, private1, masqCIDR4, internet1, internet6a, internet6b, outbound6)
	cm := newConfigMapDir(t, "nonMasqueradeCIDRs: [10.0.0.0/8, \"2001:db8:aa::/48\"]\n"+
		"masqueradeCIDRs: [10.251.0.0/24, \"2001:db8:bb::/48\"]\nresyncInterval: 1h\n")
	d := startDaemon(t, topo, "--config", cm.path(), "--enable-ipv6", "--masq-chain", "MY-MASQ")
	eventually(t, "/readyz", func() bool { code, _ := httpGet(topo, "/readyz"); return code == 200 })
	if !strings.Contains(listTable(t, topo), "chain MY-MASQ {") {
		t.Fatalf("no chain MY-MASQ:\n%s", listTable(t, topo))
	}
	expectSources(t, topo, map[string]bool{
		private1: false, masqCIDR4: true, internet1: true,
		internet6a: false, internet6b: true, outbound6: true,
	})
	code, body := httpGet(topo, "/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	values := map[string]float64{} // series (name and labels): value
	for _, l := range strings.Split(body, "\n") {
		series, v, ok := strings.Cut(l, " ")
		if !ok || strings.HasPrefix(l, "#") {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			t.Fatalf("/metrics line %q: %v", l, err)
		}
		values[series] = f
	}
	// One connection each: at least one packet under each label set.
	packets := []string{
		`{decision="nonmasquerade",family="ipv4",reason="cidrs"}`,
		`{decision="masquerade",family="ipv4",reason="cidrs"}`,
		`{decision="masquerade",family="ipv4",reason="outbound"}`,
		`{decision="nonmasquerade",family="ipv6",reason="cidrs"}`,
		`{decision="masquerade",family="ipv6",reason="cidrs"}`,
		`{decision="masquerade",family="ipv6",reason="outbound"}`,
	}
	for _, labels := range packets {
		for _, name := range []string{"ip_masq_agent_rule_packets_total", "ip_masq_agent_rule_bytes_total"} {
			if v, ok := values[name+labels]; !ok || v < 1 {
				t.Errorf("%s%s = %v (present: %v), want at least 1", name, labels, v, ok)
			}
		}
	}
	// No other rule series: every rule of the chain has one of the labels above.
	for series := range values {
		if strings.HasPrefix(series, "ip_masq_agent_rule_packets_total{") && !slices.Contains(packets, strings.TrimPrefix(series, "ip_masq_agent_rule_packets_total")) {
			t.Errorf("unexpected series %s", series)
		}
	}
	for series, want := range map[string]float64{
		`ip_masq_agent_cidrs{family="ipv4",kind="masquerade",set="masq-v4"}`:           1,
		`ip_masq_agent_cidrs{family="ipv4",kind="nonmasquerade",set="nonmasq-v4"}`:     1,
		`ip_masq_agent_cidrs{family="ipv6",kind="masquerade",set="masq-v6"}`:           1,
		`ip_masq_agent_cidrs{family="ipv6",kind="nonmasquerade",set="nonmasq-v6"}`:     1,
		`ip_masq_agent_intervals{family="ipv4",kind="masquerade",set="masq-v4"}`:       1,
		`ip_masq_agent_intervals{family="ipv4",kind="nonmasquerade",set="nonmasq-v4"}`: 2, // and 169.254.0.0/16
		`ip_masq_agent_intervals{family="ipv6",kind="masquerade",set="masq-v6"}`:       1,
		`ip_masq_agent_intervals{family="ipv6",kind="nonmasquerade",set="nonmasq-v6"}`: 2, // and fe80::/10
		`ip_masq_agent_rule_counters_read_errors_total`:                                0,
	} {
		if v, ok := values[series]; !ok || v != want {
			t.Errorf("%s = %v (present: %v), want %v", series, v, ok, want)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s\nthe table:\n%s\nthe log:\n%s", body, listTable(t, topo), d.output())
	}
}

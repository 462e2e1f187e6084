package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/metrics"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
	"github.com/ip-masq-agent/ip-masq-agent-nft/original"
)

// t0 is the synthetic start of every test's clock.
var t0 = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type harness struct {
	t       *testing.T
	a       *Agent
	fake    *nft.Fake
	orig    *original.Fake
	m       *metrics.Agent
	path    string
	logs    *syncBuffer
	applied [][2]nft.Table
}

// newHarness returns an agent on a fake kernel whose config file (not
// written yet: the defaults) is h.path.
func newHarness(t *testing.T, change func(*Options)) *harness {
	t.Helper()
	h := &harness{t: t, fake: &nft.Fake{}, orig: &original.Fake{}, m: metrics.New("test", nil), logs: &syncBuffer{}}
	h.path = filepath.Join(t.TempDir(), "config")
	o := Options{ConfigPath: h.path, NFT: nft.Options{Chain: nft.DefaultChain, RandomFully: true},
		Applied:  func(old, new nft.Table) { h.applied = append(h.applied, [2]nft.Table{old, new}) },
		Original: h.orig}
	if change != nil {
		change(&o)
	}
	log := slog.New(slog.NewTextHandler(io.MultiWriter(h.logs), &slog.HandlerOptions{Level: slog.LevelDebug}))
	h.a = New(o, h.fake, log, h.m)
	return h
}

func (h *harness) write(yaml string) {
	h.t.Helper()
	if err := os.WriteFile(h.path, []byte(yaml), 0o644); err != nil {
		h.t.Fatal(err)
	}
}

// want returns the table of a config, as the fake holds it (owned).
func (h *harness) want(yaml string) nft.Table {
	h.t.Helper()
	cfg := config.Default(h.a.opts.Flags)
	if yaml != "" {
		var err error
		if cfg, _, err = config.Parse([]byte(yaml), h.a.opts.Flags); err != nil {
			h.t.Fatal(err)
		}
	}
	w := nft.Build(cfg, h.a.opts.NFT)
	w.Owner, w.Persist = nft.OwnedByUs, true
	return w
}

// holds fails unless the fake kernel holds want.
func (h *harness) holds(want nft.Table, what string) {
	h.t.Helper()
	got := h.fake.Table()
	if got == nil || !want.Equal(*got) {
		s := "(no table)"
		if got != nil {
			s = nft.Render(*got)
		}
		h.t.Fatalf("%s: the kernel holds\n%s\nwant\n%s", what, s, nft.Render(want))
	}
}

func (h *harness) sent() int { return len(h.fake.Sent()) }

func (h *harness) get(path string) (int, string) {
	rec := httptest.NewRecorder()
	h.m.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, rec.Body.String()
}

// healthy is liveness: the loop turns.
func (h *harness) healthy() bool {
	code, _ := h.get("/healthz")
	return code == http.StatusOK
}

// ready is readiness: the kernel was last found holding the config's table.
func (h *harness) ready() bool {
	code, _ := h.get("/readyz")
	return code == http.StatusOK
}

// metric returns a line of /metrics that starts with prefix.
func (h *harness) metric(prefix string) string {
	_, body := h.get("/metrics")
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

func (h *harness) sync(now time.Time) {
	h.t.Helper()
	if err := h.a.Sync(now); err != nil {
		h.t.Fatalf("Sync: %v", err)
	}
}

// unowned is a table without its ownership, for comparing contents.
func unowned(t nft.Table) nft.Table {
	t.Owner, t.Persist = nft.NotOwned, false
	return t
}

func dropNonMasq(t **nft.Table) { (*t).Set(nft.SetNonMasqV4).Elements = nil }

func TestFirstSyncCreatesThenResyncSendsNothing(t *testing.T) {
	h := newHarness(t, nil)
	if got := h.a.next(); !got.IsZero() {
		t.Errorf("next before any sync: %v, want now", got)
	}
	h.sync(t0)
	h.holds(h.want(""), "first sync")
	if h.sent() != 1 {
		t.Fatalf("%d plans sent", h.sent())
	}
	if !h.a.deadline.Equal(at(time.Minute)) || !h.a.next().Equal(at(time.Minute)) {
		t.Errorf("deadline %v, next %v; want the default interval", h.a.deadline, h.a.next())
	}
	if code, body := h.get("/readyz"); code != http.StatusOK {
		t.Errorf("readyz %d %s", code, body)
	}
	if l := h.metric(`ip_masq_agent_config_loads_total{result="missing"}`); !strings.HasSuffix(l, " 1") {
		t.Errorf("config loads: %q", l)
	}
	// A missing file is no silent default: one WARN naming the path.
	if n := strings.Count(h.logs.String(), "level=WARN msg=\""+h.path+": does not exist: the defaults are in force"); n != 1 {
		t.Errorf("%d warnings about the missing file, want 1:\n%s", n, h.logs.String())
	}
	if l := h.metric(`ip_masq_agent_config_last_reload_successful`); !strings.HasSuffix(l, " 1") {
		t.Errorf("config_last_reload_successful: %q", l)
	}
	if l := h.metric(`ip_masq_agent_config_info{hash="` + config.Default(h.a.opts.Flags).Hash() + `"}`); !strings.HasSuffix(l, " 1") {
		t.Errorf("config_info: %q", l)
	}
	if l := h.metric(`ip_masq_agent_intervals{family="ipv4",kind="nonmasquerade",set="nonmasq-v4"}`); !strings.HasSuffix(l, " 4") {
		t.Errorf("intervals: %q", l)
	}
	// Nothing is due before the deadline.
	h.a.Tick(at(59 * time.Second))
	// The resync at the deadline reads back an equal table: nothing sent.
	h.a.Tick(at(time.Minute))
	if h.sent() != 1 || !h.a.deadline.Equal(at(2*time.Minute)) {
		t.Errorf("resync: %d plans sent, deadline %v", h.sent(), h.a.deadline)
	}
	// Once, at the first sync, against no table (nothing masqueraded
	// before); never for a resync that changed nothing.
	if len(h.applied) != 1 || len(h.applied[0][0].Chains) != 0 {
		t.Errorf("Applied called %d times, want once, against no table", len(h.applied))
	}
	if !strings.Contains(h.logs.String(), "nothing sent") {
		t.Errorf("logs:\n%s", h.logs)
	}
}

// A restart that finds the right table adopts it without a write.
func TestAdoptsEqualTable(t *testing.T) {
	h := newHarness(t, nil)
	want := h.want("")
	h.fake.Tamper("previous agent", func(t **nft.Table) { *t = want.Clone() })
	h.sync(t0)
	if h.sent() != 0 || !strings.Contains(h.logs.String(), "the kernel holds the config's table already") {
		t.Errorf("%d plans sent; logs:\n%s", h.sent(), h.logs)
	}
}

func TestConfigChangeApplies(t *testing.T) {
	h := newHarness(t, nil)
	h.sync(t0)
	const yaml = "nonMasqueradeCIDRs: [10.0.0.0/8, 192.0.2.0/24]\nmasqueradeCIDRs: [10.10.10.10/32]\nresyncInterval: 5s\n"
	h.write(yaml)
	h.sync(at(time.Second))
	h.holds(h.want(yaml), "after the change")
	if !h.a.deadline.Equal(at(6 * time.Second)) {
		t.Errorf("deadline %v: want the new interval from the sync", h.a.deadline)
	}
	if len(h.applied) != 2 || !unowned(h.want("")).Equal(unowned(h.applied[1][0])) || !unowned(h.want(yaml)).Equal(unowned(h.applied[1][1])) {
		t.Fatalf("Applied: %d calls", len(h.applied))
	}
	if !strings.Contains(h.logs.String(), "applied new config") {
		t.Errorf("logs:\n%s", h.logs)
	}
	if l := h.metric(`ip_masq_agent_config_loads_total{result="success"}`); !strings.HasSuffix(l, " 1") {
		t.Errorf("config loads: %q", l)
	}
}

func TestBadConfigKeepsKernelAndBacksOff(t *testing.T) {
	h := newHarness(t, nil)
	const good = "nonMasqueradeCIDRs: [10.0.0.0/8]\nresyncInterval: 5s\n"
	h.write(good)
	h.sync(t0)
	n := h.sent()
	h.write("nonMasqueradeCIDRs: [not-a-cidr]\n")
	now := at(time.Second)
	if err := h.a.Sync(now); err == nil {
		t.Fatal("a bad config synced")
	}
	deadline := h.a.deadline
	var waits []time.Duration
	for range 6 {
		waits = append(waits, h.a.retryAt.Sub(now))
		now = h.a.next()
		h.a.Tick(now)
	}
	if want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second, 5 * time.Second}; fmt.Sprint(waits) != fmt.Sprint(want) {
		t.Errorf("retries after %v, want %v (capped at the interval)", waits, want)
	}
	if h.a.failures != 7 || !h.a.deadline.Equal(deadline) {
		t.Errorf("failures %d, deadline %v", h.a.failures, h.a.deadline)
	}
	h.holds(h.want(good), "bad config")
	if h.sent() != n {
		t.Errorf("%d plans sent for a bad config", h.sent()-n)
	}
	// A bad config counts as such; by design (internal/metrics' package
	// comment) it does not make /healthz fail: restarting cannot fix it.
	if l := h.metric(`ip_masq_agent_config_loads_total{result="error"}`); !strings.HasSuffix(l, " 7") {
		t.Errorf("config loads: %q", l)
	}
	if !h.healthy() {
		t.Error("a bad config failed /healthz")
	}
	// But the kernel's table is not the config's: not ready, and why.
	if _, body := h.get("/readyz"); h.ready() || !strings.Contains(body, "config not applied") || !strings.Contains(body, "last good config's table stays in force") {
		t.Errorf("a bad config: /readyz %q", body)
	}
	if c := strings.Count(h.logs.String(), "level=ERROR msg=\"config not applied"); c != 1 {
		t.Errorf("the same error logged %d times", c)
	}
	// Fixed: applied at the next retry, failures reset.
	const fixed = "nonMasqueradeCIDRs: [10.0.0.0/8, 192.0.2.0/24]\nresyncInterval: 5s\n"
	h.write(fixed)
	now = h.a.next()
	h.a.Tick(now)
	h.holds(h.want(fixed), "fixed config")
	if h.a.failures != 0 || !h.a.deadline.Equal(now.Add(5*time.Second)) {
		t.Errorf("failures %d, deadline %v", h.a.failures, h.a.deadline)
	}
}

// A partly bad config directory: the bad file's last good content stays.
func TestConfigDirPartial(t *testing.T) {
	h := newHarness(t, nil)
	dir := t.TempDir()
	h.a.opts.ConfigPath = dir
	os.WriteFile(filepath.Join(dir, "ip-masq-a"), []byte("nonMasqueradeCIDRs: [10.0.0.0/8]\n"), 0o644)
	h.sync(t0)
	os.WriteFile(filepath.Join(dir, "ip-masq-a"), []byte("nonMasqueradeCIDRs: [bad]\n"), 0o644)
	if err := h.a.Sync(at(time.Second)); err != nil {
		t.Fatalf("partial: %v", err)
	}
	h.holds(h.want("nonMasqueradeCIDRs: [10.0.0.0/8]\n"), "partial")
	if !strings.Contains(h.logs.String(), "its last good content stays in force") {
		t.Errorf("logs:\n%s", h.logs)
	}
}

func TestTamperRepairedWithoutMovingDeadline(t *testing.T) {
	h := newHarness(t, nil)
	h.write("resyncInterval: 5s\n")
	h.sync(t0)
	deadline := h.a.deadline
	h.fake.Tamper("flush set", dropNonMasq)
	h.a.KernelEvent(nft.Event{What: "delset"}, at(time.Second))
	h.holds(h.want("resyncInterval: 5s\n"), "repair")
	if !h.a.deadline.Equal(deadline) || !h.a.repairAt.IsZero() {
		t.Errorf("deadline %v (was %v), repairAt %v", h.a.deadline, deadline, h.a.repairAt)
	}
	if l := h.metric(`ip_masq_agent_repairs_total{what="set-changed"}`); !strings.HasSuffix(l, " 1") {
		t.Errorf("repairs: %q", l)
	}
	if len(h.applied) != 2 || len(h.applied[1][0].Set(nft.SetNonMasqV4).Elements) != 0 {
		t.Errorf("Applied after a repair: %d calls", len(h.applied))
	}
	// An event that finds the table right: nothing sent.
	n := h.sent()
	h.a.KernelEvent(nft.Event{What: "ours"}, at(2*time.Second))
	if h.sent() != n {
		t.Error("a verification of an equal table wrote")
	}
}

// The failure #5: foreign touches every 3 s with resyncInterval
// 5s must not starve the resync. A config change made without a file
// event (the watch unavailable) is applied at the deadline.
func TestRepairsDoNotStarveResync(t *testing.T) {
	h := newHarness(t, nil)
	h.write("resyncInterval: 5s\n")
	h.sync(t0)
	const changed = "resyncInterval: 5s\nnonMasqueradeCIDRs: [192.0.2.0/24]\n"
	h.write(changed) // no file event
	for _, d := range []time.Duration{1, 4} {
		h.fake.Tamper("flush set", dropNonMasq)
		h.a.KernelEvent(nft.Event{What: "touch"}, at(d*time.Second))
		h.holds(h.want("resyncInterval: 5s\n"), "repair of the old config")
		if got := h.a.next(); !got.Equal(at(5 * time.Second)) {
			t.Fatalf("after the repair at %ds the loop waits until %v, want the resync deadline", d, got)
		}
	}
	h.a.Tick(at(5 * time.Second))
	h.holds(h.want(changed), "resync at its deadline")
	// Touches every 3 s go on; resyncs happen every 5 s regardless.
	syncs := 0
	for s := 6; s <= 30; s++ {
		now := at(time.Duration(s) * time.Second)
		if s%3 == 0 {
			h.fake.Tamper("flush set", dropNonMasq)
			h.a.KernelEvent(nft.Event{What: "touch"}, now)
		}
		before := h.a.deadline
		h.a.Tick(now)
		if !h.a.deadline.Equal(before) {
			syncs++
		}
	}
	if syncs != 5 {
		t.Errorf("%d resyncs between 6 s and 30 s, want 5", syncs)
	}
}

func TestRepairAfterFailedSyncKeepsHealthFailing(t *testing.T) {
	h := newHarness(t, nil)
	h.write("resyncInterval: 5s\n")
	h.sync(t0)
	if !h.ready() {
		t.Fatal("not ready after a good sync")
	}
	h.fake.ReadErr = errors.New("netlink broke")
	h.a.Tick(at(5 * time.Second))
	if h.ready() || !h.healthy() || h.a.failures != 1 {
		t.Fatalf("a failed sync: ready %v, alive %v, failures %d", h.ready(), h.healthy(), h.a.failures)
	}
	_, body := h.get("/readyz")
	if !strings.Contains(body, "last sync failed") || !strings.Contains(body, "netlink broke") {
		t.Errorf("readyz: %q", body)
	}
	h.fake.ReadErr = nil
	h.fake.Tamper("flush set", dropNonMasq)
	h.a.KernelEvent(nft.Event{What: "touch"}, at(5500*time.Millisecond))
	h.holds(h.want("resyncInterval: 5s\n"), "repair")
	if h.ready() || h.a.failures != 1 || !h.a.retryAt.Equal(at(6*time.Second)) {
		t.Errorf("after a repair: ready %v, failures %d, retry at %v", h.ready(), h.a.failures, h.a.retryAt)
	}
	// The retry syncs: ready again.
	h.a.Tick(h.a.next())
	if !h.ready() || h.a.failures != 0 {
		t.Errorf("after the retry: ready %v, failures %d", h.ready(), h.a.failures)
	}
}

func TestRivalWriterBacksOff(t *testing.T) {
	h := newHarness(t, nil)
	h.write("resyncInterval: 5s\n")
	h.sync(t0)
	want := h.want("resyncInterval: 5s\n")
	for i, d := range []time.Duration{1, 4, 7} {
		h.fake.Tamper("rival", dropNonMasq)
		h.a.KernelEvent(nft.Event{What: "rival"}, at(d*time.Second))
		h.holds(want, fmt.Sprintf("repair %d", i+1))
	}
	if h.a.rival != time.Second {
		t.Errorf("back-off %v after 3 repairs in 10 s", h.a.rival)
	}
	if l := h.metric("ip_masq_agent_rival_writer "); l != "ip_masq_agent_rival_writer 1" {
		t.Errorf("metric: %q", l)
	}
	if c := strings.Count(h.logs.String(), "another process keeps rewriting"); c != 1 {
		t.Errorf("%d rival log lines", c)
	}
	// Backing off: the next event is repaired after the back-off, not at once.
	h.fake.Tamper("rival", dropNonMasq)
	h.a.KernelEvent(nft.Event{What: "rival"}, at(7500*time.Millisecond))
	if got := h.fake.Table(); len(got.Set(nft.SetNonMasqV4).Elements) != 0 {
		t.Error("repaired at once while backing off")
	}
	h.a.KernelEvent(nft.Event{What: "rival"}, at(7600*time.Millisecond)) // one is pending already
	if !h.a.repairAt.Equal(at(8500 * time.Millisecond)) {
		t.Errorf("repair at %v", h.a.repairAt)
	}
	h.a.Tick(at(8500 * time.Millisecond))
	h.holds(want, "repair after the back-off")
	if h.a.rival != 2*time.Second {
		t.Errorf("back-off %v, want it doubled", h.a.rival)
	}
	for i := range 5 { // capped at the interval
		h.fake.Tamper("rival", dropNonMasq)
		now := at(9*time.Second + time.Duration(i)*100*time.Millisecond)
		h.a.KernelEvent(nft.Event{What: "rival"}, now)
		h.a.Tick(h.a.repairAt)
	}
	if h.a.rival != 5*time.Second {
		t.Errorf("back-off %v, want the 5s interval", h.a.rival)
	}
	// Quiet for longer than the window: repairs are at once again.
	h.fake.Tamper("rival", dropNonMasq)
	h.a.KernelEvent(nft.Event{What: "touch"}, at(time.Minute))
	h.a.Tick(h.a.repairAt)
	if h.a.rival != 0 {
		t.Errorf("back-off %v after a quiet minute", h.a.rival)
	}
	if l := h.metric("ip_masq_agent_rival_writer "); l != "ip_masq_agent_rival_writer 0" {
		t.Errorf("metric: %q", l)
	}
}

func TestOwnedByOtherWaitsThenAdopts(t *testing.T) {
	h := newHarness(t, nil)
	want := h.want("")
	// Another agent holds the table (with another config).
	other := want.Clone()
	other.Owner = nft.OwnedByOther
	other.Set(nft.SetNonMasqV4).Elements = []nft.Range{nft.RangeFrom(netip.MustParseAddr("192.0.2.0"), netip.MustParseAddr("192.0.2.255"))}
	h.fake.Tamper("other agent", func(t **nft.Table) { *t = other.Clone() })
	if err := h.a.Sync(t0); !errors.Is(err, nft.ErrOwnedByOther) {
		t.Fatalf("Sync: %v", err)
	}
	for s := 1; s <= 3; s++ {
		if got := h.a.next(); !got.Equal(at(time.Duration(s) * time.Second)) {
			t.Fatalf("next try at %v, want every second", got)
		}
		h.a.Tick(h.a.next())
	}
	if h.sent() != 0 {
		t.Errorf("%d plans sent to a table owned by another process", h.sent())
	}
	if l := h.metric("ip_masq_agent_rival_writer "); l != "ip_masq_agent_rival_writer 1" {
		t.Errorf("metric: %q", l)
	}
	if c := strings.Count(h.logs.String(), "waiting for it to exit"); c != 1 {
		t.Errorf("%d waiting log lines", c)
	}
	// The owner exits: its table stays, orphaned, and is adopted.
	h.fake.Tamper("owner exits", func(t **nft.Table) { (*t).Owner, (*t).Persist = nft.NotOwned, true })
	h.a.Tick(h.a.next())
	h.holds(want, "adopted")
	if h.a.waiting || h.a.failures != 0 {
		t.Errorf("waiting %v, failures %d", h.a.waiting, h.a.failures)
	}

	// Taken over after the first sync: the repair waits too.
	h.fake.Tamper("other agent", func(t **nft.Table) { (*t).Owner = nft.OwnedByOther })
	n := h.sent()
	h.a.KernelEvent(nft.Event{What: "other"}, at(10*time.Second))
	if !h.a.repairAt.Equal(at(11*time.Second)) || h.sent() != n {
		t.Errorf("repair at %v, %d sent", h.a.repairAt, h.sent()-n)
	}
	h.fake.Tamper("owner exits", func(t **nft.Table) { (*t).Owner, (*t).Persist = nft.NotOwned, true })
	h.a.Tick(at(11 * time.Second))
	h.holds(want, "adopted after a repair")
}

func TestRepairFailureRetries(t *testing.T) {
	h := newHarness(t, nil)
	h.sync(t0)
	// Before any sync there is nothing to repair.
	h2 := newHarness(t, nil)
	h2.a.KernelEvent(nft.Event{What: "early"}, t0)
	if h2.sent() != 0 || !h2.a.repairAt.IsZero() {
		t.Error("repaired before a sync")
	}

	h.fake.Tamper("delete table", func(t **nft.Table) { *t = nil })
	h.fake.SendErr = errors.New("operation not permitted")
	h.a.KernelEvent(nft.Event{What: "delete table"}, at(time.Second))
	if !h.a.repairAt.Equal(at(2 * time.Second)) {
		t.Errorf("retry at %v", h.a.repairAt)
	}
	h.fake.SendErr = nil
	h.a.Tick(at(2 * time.Second))
	h.holds(h.want(""), "repair retried")
	if l := h.metric(`ip_masq_agent_repairs_total{what="table-deleted"}`); !strings.HasSuffix(l, " 1") {
		t.Errorf("repairs: %q", l)
	}
	// A chain changed, and a dormant table.
	h.fake.Tamper("rule", func(t **nft.Table) { (*t).Chains[1].Rules = nil })
	h.a.KernelEvent(nft.Event{What: "rule"}, at(20*time.Second))
	h.fake.Tamper("dormant", func(t **nft.Table) { (*t).Dormant = true })
	h.a.KernelEvent(nft.Event{What: "table"}, at(40*time.Second))
	h.holds(h.want(""), "repairs")
	for _, what := range []string{"chain-changed", "other"} {
		if l := h.metric(`ip_masq_agent_repairs_total{what="` + what + `"}`); !strings.HasSuffix(l, " 1") {
			t.Errorf("repairs %s: %q", what, l)
		}
	}
}

// A resync that finds the table changed (no event seen) puts it back and
// counts a repair.
func TestResyncRepairs(t *testing.T) {
	h := newHarness(t, nil)
	h.sync(t0)
	h.fake.Tamper("flush set", dropNonMasq)
	h.a.Tick(at(time.Minute))
	h.holds(h.want(""), "resync")
	if !strings.Contains(h.logs.String(), "by=resync") {
		t.Errorf("logs:\n%s", h.logs)
	}
}

func TestSyncKernelErrorHint(t *testing.T) {
	h := newHarness(t, nil)
	h.fake.SendErr = errors.New("operation not permitted")
	err := h.a.Sync(t0)
	if err == nil || h.ready() || !h.healthy() {
		t.Fatalf("Sync: %v, ready %v, alive %v", err, h.ready(), h.healthy())
	}
	if _, body := h.get("/readyz"); !strings.Contains(body, "CAP_NET_ADMIN") || !strings.Contains(body, "no config applied yet") {
		t.Errorf("readyz: %q", body)
	}
	if got := Hint(os.ErrPermission); !strings.Contains(got.Error(), "CAP_NET_ADMIN") || !errors.Is(got, os.ErrPermission) {
		t.Errorf("Hint: %v", got)
	}
	if e := errors.New("x"); Hint(e) != e {
		t.Error("Hint changed an unrelated error")
	}
	if h.a.interval() != time.Minute {
		t.Errorf("interval before any config: %v", h.a.interval())
	}
}

func TestFirstOp(t *testing.T) {
	if firstOp(nft.Plan{}) != "" {
		t.Error("an empty plan has a first operation")
	}
	long := nft.Plan{Ops: []nft.Op{{Verb: nft.Add, Kind: nft.KindRule, Name: "c", Rule: &nft.Rule{Comment: strings.Repeat("x", 300)}}}}
	if s := firstOp(long); len(s) != 203 || !strings.HasSuffix(s, "...") {
		t.Errorf("firstOp: %d bytes", len(s))
	}
}

// Run: the first sync, a file event, and a kernel event through the
// fake's Watch, then shutdown.
func TestRun(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.Watch = true })
	h.a.opts.Applied = nil // called from Run's goroutine
	ctx, cancel := context.WithCancel(context.Background())
	files := make(chan struct{})
	done := make(chan struct{})
	go func() {
		h.a.Run(ctx, files)
		close(done)
	}()
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s; logs:\n%s", what, h.logs)
			}
		}
	}
	equal := func(w nft.Table) func() bool {
		return func() bool { got := h.fake.Table(); return got != nil && w.Equal(*got) }
	}
	waitFor("the first sync", equal(h.want("")))
	const changed = "nonMasqueradeCIDRs: [192.0.2.0/24]\n"
	h.write(changed)
	files <- struct{}{}
	waitFor("the config change", equal(h.want(changed)))
	// The watch is subscribed once Run has started it.
	waitFor("a repair through the watch", func() bool {
		h.fake.Tamper("flush set", dropNonMasq)
		time.Sleep(20 * time.Millisecond)
		return equal(h.want(changed))()
	})
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
}

// calls counts the reads and sends of a kernel, by the synthetic time of
// the Tick that made them.
type calls struct {
	*nft.Fake
	reads, sends int
}

func (c *calls) Read() (*nft.Table, uint32, error) { c.reads++; return c.Fake.Read() }

func (c *calls) Send(p nft.Plan, gen uint32) (nft.Sent, error) { c.sends++; return c.Fake.Send(p, gen) }

// An agent that starts while another process owns the table leaves it
// alone (nothing sent, the owner's table unchanged), looks again once a
// second, and adopts it within a second of the owner's exit: checked at
// every tick, 100 ms apart.
func TestOwnedByOtherAtStartRetriesEverySecond(t *testing.T) {
	h := newHarness(t, nil)
	k := &calls{Fake: h.fake}
	h.a = New(h.a.opts, k, h.a.log, h.m)
	theirs := h.want("nonMasqueradeCIDRs: [192.0.2.0/24]\n") // the other agent's config
	theirs.Owner, theirs.Persist = nft.OwnedByOther, true
	h.fake.Tamper("other agent", func(t **nft.Table) { c := theirs.Clone(); *t = c })
	want := h.want("")
	h.a.Sync(t0)
	exit := at(10 * time.Second)
	looks := []time.Time{t0}
	var adopted time.Time
	for now := t0.Add(100 * time.Millisecond); now.Before(at(15 * time.Second)); now = now.Add(100 * time.Millisecond) {
		if now.Equal(exit) {
			h.fake.Tamper("owner exits", func(t **nft.Table) { (*t).Owner = nft.NotOwned })
		}
		reads := k.reads
		h.a.Tick(now)
		if k.reads > reads && now.Before(exit) {
			looks = append(looks, now)
		}
		got := h.fake.Table()
		switch {
		case now.Before(exit):
			if k.sends != 0 || got == nil || !got.Equal(theirs) {
				t.Fatalf("at %s, while another process owns the table: %d transactions sent, the table:\n%s",
					now.Sub(t0), k.sends, nft.Render(*got))
			}
		case adopted.IsZero() && got != nil && got.Equal(want):
			adopted = now
		case adopted.IsZero() && now.Sub(exit) >= time.Second:
			t.Fatalf("not adopted %s after the owner's exit (want within %s); the table:\n%s", now.Sub(exit), time.Second, nft.Render(*got))
		case !adopted.IsZero() && (got == nil || !got.Equal(want)):
			t.Fatalf("at %s, after the adoption, the table is:\n%s", now.Sub(t0), nft.Render(*got))
		}
	}
	for i := 1; i < len(looks); i++ {
		if gap := looks[i].Sub(looks[i-1]); gap != time.Second {
			t.Errorf("looks at the owned table %s and %s after the start: %s apart, want %s", looks[i-1].Sub(t0), looks[i].Sub(t0), gap, time.Second)
		}
	}
	if len(looks) < 10 {
		t.Errorf("%d looks at the owned table in 10 s, want one a second", len(looks))
	}
	if n := strings.Count(h.logs.String(), "waiting for it to exit"); n != 1 {
		t.Errorf("the wait logged %d times, want once:\n%s", n, h.logs)
	}
	if n := strings.Count(h.logs.String(), "its previous owner is gone"); n != 1 {
		t.Errorf("the adoption logged %d times, want once:\n%s", n, h.logs)
	}
}

// The first sync cleans against the table it found: a previous agent's
// with another config (the ConfigMap changed while no agent ran).
func TestFirstSyncAppliedAgainstFoundTable(t *testing.T) {
	h := newHarness(t, nil)
	const before = "nonMasqueradeCIDRs: [203.0.113.0/24]\n"
	previous := h.want(before)
	h.fake.Tamper("previous agent", func(t **nft.Table) { *t = previous.Clone() })
	h.sync(t0)
	if len(h.applied) != 1 || !unowned(previous).Equal(unowned(h.applied[0][0])) || !unowned(h.want("")).Equal(unowned(h.applied[0][1])) {
		t.Fatalf("Applied: %d calls, want one from the found table to the config's", len(h.applied))
	}
}

// undoingKernel is a fake kernel on which another process changes the
// table right after the agent's first transaction commits, before the
// read that verifies it.
type undoingKernel struct {
	*nft.Fake
	once sync.Once
}

func (k *undoingKernel) Send(p nft.Plan, gen uint32) (nft.Sent, error) {
	s, err := k.Fake.Send(p, gen)
	if err == nil {
		k.once.Do(func() { k.Fake.Tamper("flush set", dropNonMasq) })
	}
	return s, err
}

// A change by another process between the agent's commit and its
// read-back is put back by the same apply, whose read drains the change's
// notifications (no watch event follows): the apply says so, as a repair
// (it once logged "applied config" alone, and TestTamperedShapesRepaired
// waited for a repair line that never came when its tamper landed there).
func TestChangeDuringApplyReported(t *testing.T) {
	for _, tc := range []struct {
		name  string
		first string // the config before; "": none (the first sync)
	}{{"first sync", ""}, {"new config", "resyncInterval: 5s\nnonMasqueradeCIDRs: [10.0.0.0/8]\n"}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			k := &undoingKernel{Fake: h.fake}
			if tc.first != "" {
				h.write(tc.first)
				h.sync(t0) // on the fake alone: nothing undone
			}
			h.a.kernel = k
			h.write("resyncInterval: 5s\n")
			h.sync(at(time.Second))
			h.holds(h.want("resyncInterval: 5s\n"), "after the apply")
			logs := h.logs.String()
			if !strings.Contains(logs, `msg="the table differed from the wanted one; put it back" by=apply what=set-changed`) {
				t.Errorf("the change undone during the apply is not reported:\n%s", logs)
			}
			if l := h.metric(`ip_masq_agent_repairs_total{what="set-changed"}`); !strings.HasSuffix(l, " 1") {
				t.Errorf("repairs: %q", l)
			}
		})
	}
}

// An apply that the read-back finds right reports no repair.
func TestApplyWithoutChangeReportsNoRepair(t *testing.T) {
	h := newHarness(t, nil)
	h.write("resyncInterval: 5s\n")
	h.sync(t0)
	h.write("resyncInterval: 5s\nnonMasqueradeCIDRs: [10.0.0.0/8]\n")
	h.sync(at(time.Second))
	if strings.Contains(h.logs.String(), "put it back") {
		t.Errorf("a repair reported without a change:\n%s", h.logs)
	}
}

// A second agent waiting for the table's owner to exit is in a state of
// its own: waiting_for_owner is 1, and no failed sync is counted (the
// sync-failure alert must not fire for it), though it looks once a second.
func TestWaitingForOwnerIsNoFailedSync(t *testing.T) {
	h := newHarness(t, nil)
	theirs := h.want("nonMasqueradeCIDRs: [192.0.2.0/24]\n")
	theirs.Owner = nft.OwnedByOther
	h.fake.Tamper("other agent", func(t **nft.Table) { *t = theirs.Clone() })
	h.a.Sync(t0)
	for range 5 {
		h.a.Tick(h.a.next())
	}
	if l := h.metric(`ip_masq_agent_syncs_total{result="error"}`); l != `ip_masq_agent_syncs_total{result="error"} 0` {
		t.Errorf("waiting for the owner counted failed syncs: %q", l)
	}
	if l := h.metric("ip_masq_agent_waiting_for_owner "); l != "ip_masq_agent_waiting_for_owner 1" {
		t.Errorf("while waiting: %q", l)
	}
	if _, body := h.get("/readyz"); h.ready() || !strings.Contains(body, "waiting for it to exit") || !h.healthy() {
		t.Errorf("while waiting: /readyz %q, /healthz good %v", body, h.healthy())
	}
	h.fake.Tamper("owner exits", func(t **nft.Table) { (*t).Owner, (*t).Persist = nft.NotOwned, true })
	h.a.Tick(h.a.next())
	h.holds(h.want(""), "adopted")
	if l := h.metric("ip_masq_agent_waiting_for_owner "); l != "ip_masq_agent_waiting_for_owner 0" {
		t.Errorf("after the adoption: %q", l)
	}
	if l := h.metric(`ip_masq_agent_syncs_total{result="success"}`); l != `ip_masq_agent_syncs_total{result="success"} 1` {
		t.Errorf("after the adoption: %q", l)
	}

	// Taken over after the first sync: the repair waits, the same state.
	h.fake.Tamper("other agent", func(t **nft.Table) { (*t).Owner = nft.OwnedByOther })
	h.a.KernelEvent(nft.Event{What: "other"}, at(time.Minute))
	if l := h.metric("ip_masq_agent_waiting_for_owner "); l != "ip_masq_agent_waiting_for_owner 1" {
		t.Errorf("a repair waiting: %q", l)
	}
	if l := h.metric(`ip_masq_agent_syncs_total{result="error"}`); l != `ip_masq_agent_syncs_total{result="error"} 0` {
		t.Errorf("a repair waiting counted failed syncs: %q", l)
	}
}

// Going back to a good config is logged: "config not applied" must not be
// the last line while /readyz is good again. Back to the very config in
// force, the kernel needs no change and nothing else would be logged.
func TestBadConfigRecoveryLogged(t *testing.T) {
	h := newHarness(t, nil)
	const good = "nonMasqueradeCIDRs: [10.0.0.0/8]\n"
	h.write(good)
	h.sync(t0)
	h.write("nonMasqueradeCIDRs: [10.0.0.0/88]\n")
	h.a.Sync(at(time.Second))
	if !strings.Contains(lastLine(h.logs.String()), `level=ERROR msg="config not applied`) {
		t.Fatalf("a bad config: the last line is %q", lastLine(h.logs.String()))
	}
	h.write(good)
	h.a.Tick(h.a.next())
	if !h.ready() {
		t.Fatal("not ready after the good config came back")
	}
	if l := lastLine(h.logs.String()); !strings.Contains(l, `level=INFO msg="config is good again; applied"`) || !strings.Contains(l, "config="+h.path) {
		t.Errorf("after the recovery, the last line is %q", l)
	}
	// Logged once, not at every resync.
	h.a.Tick(h.a.next())
	if n := strings.Count(h.logs.String(), "config is good again"); n != 1 {
		t.Errorf("the recovery logged %d times", n)
	}
}

// lastLine is the last line of a log that is not at debug level.
func lastLine(log string) string {
	lines := strings.Split(strings.TrimSpace(log), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if !strings.Contains(lines[i], "level=DEBUG") {
			return lines[i]
		}
	}
	return ""
}

// A node that joins while the ConfigMap is bad: the agent finds no table
// and has no last good config, so it writes nothing (the node's pods are
// not masqueraded by it: no table), is not ready with the config's error,
// stays alive, counts a failed load and no failed sync, and retries; the
// fixed config is applied at the next retry. docs/runbook.md and
// docs/configuration.md say this.
func TestBadConfigAtFirstStart(t *testing.T) {
	h := newHarness(t, nil)
	h.write("nonMasqueradeCIDRs: [10.0.0.0/88]\n")
	if err := h.a.Sync(t0); err == nil {
		t.Fatal("a bad config synced")
	}
	for range 3 {
		h.a.Tick(h.a.next())
	}
	if tb := h.fake.Table(); tb != nil || h.sent() != 0 {
		t.Errorf("a bad config at the first start: %d plans sent, table %v", h.sent(), tb != nil)
	}
	_, body := h.get("/readyz")
	if h.ready() || !strings.HasPrefix(body, "no config applied yet: ") || !strings.Contains(body, `"10.0.0.0/88"`) || !strings.Contains(body, "nonMasqueradeCIDRs") {
		t.Errorf("/readyz %q", body)
	}
	if !h.healthy() {
		t.Error("a bad config at the first start failed /healthz")
	}
	for prefix, want := range map[string]string{
		`ip_masq_agent_syncs_total{result="error"}`:    "0",
		`ip_masq_agent_config_last_reload_successful `: "0",
		`ip_masq_agent_waiting_for_owner `:             "0",
	} {
		if l := h.metric(prefix); !strings.HasSuffix(l, " "+want) {
			t.Errorf("%q, want %s", l, want)
		}
	}
	if l := h.metric("ip_masq_agent_config_info{"); l != "" {
		t.Errorf("a config in force: %q", l)
	}
	h.write("nonMasqueradeCIDRs: [10.0.0.0/8]\n")
	h.a.Tick(h.a.next())
	h.holds(h.want("nonMasqueradeCIDRs: [10.0.0.0/8]\n"), "fixed")
	if !h.ready() || !strings.Contains(h.logs.String(), "config is good again; applied") {
		t.Errorf("fixed: ready %v, logs\n%s", h.ready(), h.logs)
	}
}

// A snat address on no interface: a warning once, the gauge at 0 and no
// snat rule; once an interface holds it, the next sync rebuilds the table
// with the rule, without a change of the config.
func TestSNATInterfaces(t *testing.T) {
	var links []string
	h := newHarness(t, func(o *Options) { o.NFT.Links = func(netip.Addr) []string { return links } })
	h.write("snatAddress: 192.0.2.10\n")
	now := time.Now()
	h.sync(now)
	h.sync(now.Add(time.Minute))
	if n := strings.Count(h.logs.String(), "snatAddress 192.0.2.10 is on no interface of this node"); n != 1 {
		t.Errorf("warned %d times, want once:\n%s", n, h.logs.String())
	}
	if got := h.metric("ip_masq_agent_snat_address_interfaces"); got != `ip_masq_agent_snat_address_interfaces{key="snatAddress"} 0` {
		t.Errorf("metric %q", got)
	}
	if s := nft.Render(*h.fake.Table()); strings.Contains(s, "snat") {
		t.Errorf("a snat rule without an interface:\n%s", s)
	}
	links = []string{"eth0"}
	h.sync(now.Add(2 * time.Minute))
	if s := nft.Render(*h.fake.Table()); !strings.Contains(s, `oifname "eth0"`) {
		t.Errorf("no snat rule once eth0 holds the address:\n%s", s)
	}
	if got := h.metric("ip_masq_agent_snat_address_interfaces"); got != `ip_masq_agent_snat_address_interfaces{key="snatAddress"} 1` {
		t.Errorf("metric %q", got)
	}
	h.write("")
	h.sync(now.Add(3 * time.Minute))
	if got := h.metric("ip_masq_agent_snat_address_interfaces"); got != "" {
		t.Errorf("metric without the key: %q", got)
	}
}

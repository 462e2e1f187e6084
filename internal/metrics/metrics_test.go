package metrics

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// clock is a settable clock for the health checks.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

var t0 = time.Unix(1700000000, 0)

// newTestAgent returns an Agent on a fake clock at t0, logging nowhere.
func newTestAgent(read func() ([]RuleCounter, error)) (*Agent, *clock) {
	c := &clock{t: t0}
	a := New("v1.2.3", read)
	a.now = c.Now
	a.health.start = c.Now()
	a.log = quietLogger()
	a.rules.log = a.log
	return a, c
}

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// get requests path from h and returns the status code, Content-Type and
// body.
func get(t *testing.T, h http.Handler, method, path string) (int, string, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	return rec.Code, rec.Header().Get("Content-Type"), rec.Body.String()
}

func TestMetricsAfterCalls(t *testing.T) {
	a, _ := newTestAgent(nil)
	a.SyncDone("success", 125*time.Millisecond)
	a.SyncDone("error", 2*time.Second)
	a.ConfigLoaded("success")
	a.ConfigLoaded("success")
	a.ConfigLoaded("missing")
	a.SetElements("nonmasq4", "ipv4", "nonmasquerade", 9, 7)
	a.SetElements("masq6", "ipv6", "masquerade", 2, 1)
	a.SetElements("nonmasq4", "ipv4", "nonmasquerade", 10, 8) // replaces
	a.Repaired("table-deleted")
	a.Repaired("set-changed")
	a.Repaired("set-changed")

	want := `
# HELP ip_masq_agent_build_info Always 1; the label carries the agent's version.
# TYPE ip_masq_agent_build_info gauge
ip_masq_agent_build_info{version="v1.2.3"} 1
# HELP ip_masq_agent_syncs_total Syncs of the rules to the kernel, by result (success or error).
# TYPE ip_masq_agent_syncs_total counter
ip_masq_agent_syncs_total{result="error"} 1
ip_masq_agent_syncs_total{result="success"} 1
# HELP ip_masq_agent_sync_duration_seconds How long a sync of the rules to the kernel took, successful or not.
# TYPE ip_masq_agent_sync_duration_seconds histogram
ip_masq_agent_sync_duration_seconds_bucket{le="0.0001"} 0
ip_masq_agent_sync_duration_seconds_bucket{le="0.00025"} 0
ip_masq_agent_sync_duration_seconds_bucket{le="0.0005"} 0
ip_masq_agent_sync_duration_seconds_bucket{le="0.001"} 0
ip_masq_agent_sync_duration_seconds_bucket{le="0.0025"} 0
ip_masq_agent_sync_duration_seconds_bucket{le="0.005"} 0
ip_masq_agent_sync_duration_seconds_bucket{le="0.01"} 0
ip_masq_agent_sync_duration_seconds_bucket{le="0.025"} 0
ip_masq_agent_sync_duration_seconds_bucket{le="0.05"} 0
ip_masq_agent_sync_duration_seconds_bucket{le="0.1"} 0
ip_masq_agent_sync_duration_seconds_bucket{le="0.25"} 1
ip_masq_agent_sync_duration_seconds_bucket{le="0.5"} 1
ip_masq_agent_sync_duration_seconds_bucket{le="1"} 1
ip_masq_agent_sync_duration_seconds_bucket{le="2.5"} 2
ip_masq_agent_sync_duration_seconds_bucket{le="5"} 2
ip_masq_agent_sync_duration_seconds_bucket{le="+Inf"} 2
ip_masq_agent_sync_duration_seconds_sum 2.125
ip_masq_agent_sync_duration_seconds_count 2
# HELP ip_masq_agent_last_successful_sync_timestamp_seconds Unix time of the last successful sync; 0 before the first one.
# TYPE ip_masq_agent_last_successful_sync_timestamp_seconds gauge
ip_masq_agent_last_successful_sync_timestamp_seconds 1.7e+09
# HELP ip_masq_agent_config_loads_total Loads of the config file, by result (success, error: kept the previous config, missing: defaults).
# TYPE ip_masq_agent_config_loads_total counter
ip_masq_agent_config_loads_total{result="error"} 0
ip_masq_agent_config_loads_total{result="missing"} 1
ip_masq_agent_config_loads_total{result="success"} 2
# HELP ip_masq_agent_cidrs CIDRs in the config for a set, by set, family and kind (masquerade or nonmasquerade).
# TYPE ip_masq_agent_cidrs gauge
ip_masq_agent_cidrs{family="ipv4",kind="nonmasquerade",set="nonmasq4"} 10
ip_masq_agent_cidrs{family="ipv6",kind="masquerade",set="masq6"} 2
# HELP ip_masq_agent_intervals Intervals in the kernel's set: one per CIDR not inside another (adjacent ones joined where the kernel's interval lookup is the array's: Linux 7.0, 6.18.14, 6.19.4 and later), by set, family and kind.
# TYPE ip_masq_agent_intervals gauge
ip_masq_agent_intervals{family="ipv4",kind="nonmasquerade",set="nonmasq4"} 8
ip_masq_agent_intervals{family="ipv6",kind="masquerade",set="masq6"} 1
# HELP ip_masq_agent_repairs_total Changes to the agent's table by someone else that a sync undid, by what was changed.
# TYPE ip_masq_agent_repairs_total counter
ip_masq_agent_repairs_total{what="chain-changed"} 0
ip_masq_agent_repairs_total{what="other"} 0
ip_masq_agent_repairs_total{what="set-changed"} 2
ip_masq_agent_repairs_total{what="table-deleted"} 1
# HELP ip_masq_agent_rule_counters_read_errors_total Scrapes that could not read the rules' counters from the kernel (and so had no rule_packets_total or rule_bytes_total).
# TYPE ip_masq_agent_rule_counters_read_errors_total counter
ip_masq_agent_rule_counters_read_errors_total 0
`
	names := []string{
		"ip_masq_agent_build_info",
		"ip_masq_agent_syncs_total",
		"ip_masq_agent_sync_duration_seconds",
		"ip_masq_agent_last_successful_sync_timestamp_seconds",
		"ip_masq_agent_config_loads_total",
		"ip_masq_agent_cidrs",
		"ip_masq_agent_intervals",
		"ip_masq_agent_repairs_total",
		"ip_masq_agent_rule_counters_read_errors_total",
		"ip_masq_agent_rule_packets_total",
		"ip_masq_agent_rule_bytes_total",
	}
	if err := testutil.GatherAndCompare(a.reg, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
}

func TestInitialMetrics(t *testing.T) {
	a, _ := newTestAgent(nil)
	want := `
# HELP ip_masq_agent_last_successful_sync_timestamp_seconds Unix time of the last successful sync; 0 before the first one.
# TYPE ip_masq_agent_last_successful_sync_timestamp_seconds gauge
ip_masq_agent_last_successful_sync_timestamp_seconds 0
# HELP ip_masq_agent_syncs_total Syncs of the rules to the kernel, by result (success or error).
# TYPE ip_masq_agent_syncs_total counter
ip_masq_agent_syncs_total{result="error"} 0
ip_masq_agent_syncs_total{result="success"} 0
`
	if err := testutil.GatherAndCompare(a.reg, strings.NewReader(want),
		"ip_masq_agent_last_successful_sync_timestamp_seconds", "ip_masq_agent_syncs_total"); err != nil {
		t.Error(err)
	}
	if n, err := testutil.GatherAndCount(a.reg, "ip_masq_agent_cidrs", "ip_masq_agent_rule_packets_total"); err != nil || n != 0 {
		t.Errorf("cidrs and rule packets before any call: %d series (err %v), want none", n, err)
	}
	// The standard collectors are there too.
	for _, name := range []string{"go_goroutines", "process_start_time_seconds"} {
		if n, err := testutil.GatherAndCount(a.reg, name); err != nil || n != 1 {
			t.Errorf("%s: %d series (err %v), want 1", name, n, err)
		}
	}
}

func TestEmptyVersion(t *testing.T) {
	a := New("", nil)
	want := `
# HELP ip_masq_agent_build_info Always 1; the label carries the agent's version.
# TYPE ip_masq_agent_build_info gauge
ip_masq_agent_build_info{version="unknown"} 1
`
	if err := testutil.GatherAndCompare(a.reg, strings.NewReader(want), "ip_masq_agent_build_info"); err != nil {
		t.Error(err)
	}
}

func TestLint(t *testing.T) {
	a, _ := newTestAgent(func() ([]RuleCounter, error) {
		return []RuleCounter{{Family: "ipv4", Decision: "masquerade", Reason: "outbound", Packets: 1, Bytes: 60}}, nil
	})
	a.SyncDone("success", time.Millisecond)
	a.SetElements("s", "ipv4", "masquerade", 1, 1)
	problems, err := testutil.GatherAndLint(a.reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, namespace) {
			t.Errorf("lint: %s: %s", p.Metric, p.Text)
		}
	}
}

func TestRuleCounters(t *testing.T) {
	var calls atomic.Int32
	a, _ := newTestAgent(func() ([]RuleCounter, error) {
		calls.Add(1)
		return []RuleCounter{
			{Family: "ipv4", Decision: "nonmasquerade", Reason: "cidrs", Packets: 10, Bytes: 1000},
			{Family: "ipv4", Decision: "masquerade", Reason: "outbound", Packets: 5, Bytes: 500},
			// Two rules with the same labels add up.
			{Family: "ipv4", Decision: "nonmasquerade", Reason: "cidrs", Packets: 1, Bytes: 100},
			{Family: "ipv6", Decision: "masquerade", Reason: "cidrs", Packets: 1 << 40, Bytes: 1 << 50},
		}, nil
	})
	code, _, body := get(t, a.Handler(), http.MethodGet, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("readCounters called %d times for one scrape, want 1", n)
	}
	for _, line := range []string{
		`ip_masq_agent_rule_packets_total{decision="nonmasquerade",family="ipv4",reason="cidrs"} 11`,
		`ip_masq_agent_rule_bytes_total{decision="nonmasquerade",family="ipv4",reason="cidrs"} 1100`,
		`ip_masq_agent_rule_packets_total{decision="masquerade",family="ipv4",reason="outbound"} 5`,
		`ip_masq_agent_rule_bytes_total{decision="masquerade",family="ipv4",reason="outbound"} 500`,
		`ip_masq_agent_rule_packets_total{decision="masquerade",family="ipv6",reason="cidrs"} 1.099511627776e+12`,
		`ip_masq_agent_rule_bytes_total{decision="masquerade",family="ipv6",reason="cidrs"} 1.125899906842624e+15`,
		`ip_masq_agent_rule_counters_read_errors_total 0`,
		"# TYPE ip_masq_agent_rule_packets_total counter",
		"# TYPE ip_masq_agent_rule_bytes_total counter",
	} {
		if !strings.Contains(body, line+"\n") {
			t.Errorf("/metrics lacks %q", line)
		}
	}
	if got := strings.Count(body, "ip_masq_agent_rule_packets_total{"); got != 3 {
		t.Errorf("%d rule_packets_total series, want 3", got)
	}
	// Each scrape reads once more.
	get(t, a.Handler(), http.MethodGet, "/metrics")
	if n := calls.Load(); n != 2 {
		t.Errorf("readCounters called %d times for two scrapes, want 2", n)
	}
}

func TestRuleCountersReadError(t *testing.T) {
	var fail atomic.Int32 // 0: works, 1: error, 2: panic
	var calls atomic.Int32
	a, _ := newTestAgent(func() ([]RuleCounter, error) {
		calls.Add(1)
		switch fail.Load() {
		case 1:
			return nil, errors.New("list table inet ip-masq-agent: no such file or directory")
		case 2:
			panic("boom")
		}
		return []RuleCounter{{Family: "ipv4", Decision: "masquerade", Reason: "outbound", Packets: 3, Bytes: 180}}, nil
	})
	a.SyncDone("success", time.Millisecond)
	scrape := func() string {
		t.Helper()
		code, _, body := get(t, a.Handler(), http.MethodGet, "/metrics")
		if code != http.StatusOK {
			t.Fatalf("/metrics: %d %s", code, body)
		}
		// The rest of the scrape is there.
		for _, s := range []string{"ip_masq_agent_syncs_total{result=\"success\"} 1\n", "go_goroutines "} {
			if !strings.Contains(body, s) {
				t.Fatalf("/metrics lacks %q", s)
			}
		}
		return body
	}

	body := scrape()
	if !strings.Contains(body, "ip_masq_agent_rule_packets_total{") {
		t.Error("no rule packets with a working read")
	}
	for i, mode := range []int32{1, 2} {
		fail.Store(mode)
		before := calls.Load()
		body = scrape()
		if n := calls.Load() - before; n != 1 {
			t.Errorf("mode %d: readCounters called %d times, want 1", mode, n)
		}
		if strings.Contains(body, "ip_masq_agent_rule_packets_total") || strings.Contains(body, "ip_masq_agent_rule_bytes_total") {
			t.Errorf("mode %d: rule counters in a scrape whose read failed", mode)
		}
		want := "ip_masq_agent_rule_counters_read_errors_total " + string(rune('1'+i)) + "\n"
		if !strings.Contains(body, want) {
			t.Errorf("mode %d: /metrics lacks %q", mode, want)
		}
	}
	fail.Store(0)
	body = scrape()
	for _, s := range []string{
		`ip_masq_agent_rule_packets_total{decision="masquerade",family="ipv4",reason="outbound"} 3` + "\n",
		"ip_masq_agent_rule_counters_read_errors_total 2\n",
	} {
		if !strings.Contains(body, s) {
			t.Errorf("after recovery, /metrics lacks %q", s)
		}
	}
}

func TestBadLabelValueIsNotAPanic(t *testing.T) {
	a, _ := newTestAgent(func() ([]RuleCounter, error) {
		return []RuleCounter{
			{Family: "ipv4", Decision: "masquerade", Reason: "outbound", Packets: 1, Bytes: 2},
			{Family: "ipv4\xff", Decision: "masquerade", Reason: "outbound", Packets: 1, Bytes: 2},
		}, nil
	})
	code, _, body := get(t, a.Handler(), http.MethodGet, "/metrics")
	if code != http.StatusOK || !strings.Contains(body, "ip_masq_agent_syncs_total") {
		t.Errorf("/metrics: %d, want 200 with the rest of the metrics", code)
	}
}

func TestHealth(t *testing.T) {
	a, c := newTestAgent(nil)
	a.SetStuckAfter(2 * time.Minute)
	h := a.Handler()
	check := func(step, path string, wantCode int, wantBody string) {
		t.Helper()
		code, ctype, body := get(t, h, http.MethodGet, path)
		if code != wantCode || body != wantBody+"\n" {
			t.Errorf("%s: %s = %d %q, want %d %q", step, path, code, body, wantCode, wantBody+"\n")
		}
		if ctype != "text/plain; charset=utf-8" {
			t.Errorf("%s: %s Content-Type %q", step, path, ctype)
		}
	}

	// Liveness: the loop turns. Readiness: the kernel holds the config's table.
	check("start", "/healthz", 200, "ok")
	check("start", "/readyz", 503, "no config applied yet")
	c.Add(2 * time.Minute)
	check("2m without a turn", "/healthz", 200, "ok")
	c.Add(time.Second)
	check("2m1s without a turn", "/healthz", 503, "the agent's loop has not started in 2m1s (stuck after 2m0s)")
	a.Alive()
	check("turned", "/healthz", 200, "ok")

	// Nothing a restart cannot fix fails liveness.
	a.NotReady("no config applied yet: /etc/config/ip-masq-agent:3: nonMasqueradeCIDRs[0]: invalid CIDR \"10.0.0.0/33\"")
	a.ConfigLoaded("error")
	a.SyncDone("error", time.Millisecond)
	check("bad first config", "/healthz", 200, "ok")
	check("bad first config", "/readyz", 503, "no config applied yet: /etc/config/ip-masq-agent:3: nonMasqueradeCIDRs[0]: invalid CIDR \"10.0.0.0/33\"")

	a.SyncDone("success", time.Millisecond)
	a.Ready()
	check("synced", "/healthz", 200, "ok")
	check("synced", "/readyz", 200, "ok")

	// A failed sync: not ready, the reason on one line; alive.
	a.NotReady("last sync failed: apply table inet ip-masq-agent:\n  operation not permitted")
	check("failed", "/readyz", 503, "last sync failed: apply table inet ip-masq-agent: operation not permitted")
	check("failed", "/healthz", 200, "ok")
	a.NotReady("another process owns table inet ip-masq-agent (another ip-masq-agent?); waiting for it to exit")
	check("waiting", "/readyz", 503, "another process owns table inet ip-masq-agent (another ip-masq-agent?); waiting for it to exit")
	check("waiting", "/healthz", 200, "ok")
	a.NotReady("")
	check("empty reason", "/readyz", 503, "not ready")
	a.Ready()
	check("recovered", "/readyz", 200, "ok")

	// A loop that stops turning fails liveness, whatever readiness says.
	c.Add(2*time.Minute + 30*time.Second)
	check("stuck", "/healthz", 503, "the agent's loop has not turned for 2m30s (stuck after 2m0s)")
	check("stuck", "/readyz", 200, "ok")
	a.SetStuckAfter(0)
	check("never stuck", "/healthz", 200, "ok")
	a.SetStuckAfter(time.Minute)
	a.Alive()
	check("turned again", "/healthz", 200, "ok")
}

func TestRoutes(t *testing.T) {
	a, _ := newTestAgent(nil)
	a.SyncDone("success", time.Millisecond)
	a.Ready()
	h := a.Handler()
	for _, tc := range []struct {
		method, path string
		code         int
	}{
		{"GET", "/metrics", 200},
		{"HEAD", "/metrics", 200},
		{"GET", "/healthz", 200},
		{"HEAD", "/healthz", 200},
		{"GET", "/readyz", 200},
		{"HEAD", "/readyz", 200},
		{"POST", "/metrics", 405},
		{"PUT", "/healthz", 405},
		{"DELETE", "/readyz", 405},
		{"OPTIONS", "/readyz", 405},
		{"GET", "/", 404},
		{"GET", "/metrics/", 404},
		{"GET", "/healthz/x", 404},
		{"GET", "/debug/pprof/", 404},
		{"GET", "/config", 404},
		{"POST", "/nothing", 404},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(tc.method, tc.path, nil))
		if rec.Code != tc.code {
			t.Errorf("%s %s = %d, want %d", tc.method, tc.path, rec.Code, tc.code)
		}
		if tc.code == 405 && rec.Header().Get("Allow") != "GET, HEAD" {
			t.Errorf("%s %s: Allow %q", tc.method, tc.path, rec.Header().Get("Allow"))
		}
		if tc.code != 200 || tc.path != "/metrics" {
			if ct := rec.Header().Get("Content-Type"); ct != "text/plain; charset=utf-8" {
				t.Errorf("%s %s: Content-Type %q", tc.method, tc.path, ct)
			}
			if body := rec.Body.String(); strings.Count(body, "\n") != 1 || !strings.HasSuffix(body, "\n") {
				t.Errorf("%s %s: body %q is not one line", tc.method, tc.path, body)
			}
		}
	}
	// The metrics are in the text format.
	_, ctype, body := get(t, h, "GET", "/metrics")
	if !strings.HasPrefix(ctype, "text/plain; version=0.0.4") || !strings.Contains(body, "# TYPE ip_masq_agent_syncs_total counter\n") {
		t.Errorf("/metrics: Content-Type %q, body:\n%s", ctype, body)
	}
}

func TestOneLine(t *testing.T) {
	for _, tc := range []struct {
		in    string
		limit int
		want  string
	}{
		{"a\nb\r\n\tc  d", 100, "a b c d"},
		{"  x  ", 100, "x"},
		{"bad \xff utf8", 100, "bad \uFFFD utf8"},
		{"abcdefghij", 10, "abcdefghij"},
		{"abcdefghijk", 10, "abcdefg..."},
		{"ééééé", 8, "éé..."}, // cut on a rune boundary
		{"a\u2028b\x00c", 100, "a b c"},
	} {
		if got := oneLine(tc.in, tc.limit); got != tc.want {
			t.Errorf("oneLine(%q, %d) = %q, want %q", tc.in, tc.limit, got, tc.want)
		}
	}
	a, _ := newTestAgent(nil)
	a.NotReady(strings.Repeat("x", 10000))
	if _, msg := a.readyz(); len(msg) > maxReason {
		t.Errorf("readyz reason %d bytes long", len(msg))
	}
}

// TestConcurrent records, scrapes and probes at once (for -race).
func TestConcurrent(t *testing.T) {
	a, _ := newTestAgent(func() ([]RuleCounter, error) {
		return []RuleCounter{{Family: "ipv4", Decision: "nonmasquerade", Reason: "outbound", Packets: 1, Bytes: 1}}, nil
	})
	a.SetStuckAfter(time.Minute)
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			for j := range 20 {
				switch i {
				case 0:
					a.SyncDone("success", time.Duration(j)*time.Millisecond)
					a.NotReady("x")
					a.Ready()
					a.Alive()
				case 1:
					a.ConfigLoaded("success")
					a.SetElements("s", "ipv4", "masquerade", j, j)
					a.Repaired("other")
				default:
					for _, p := range []string{"/metrics", "/healthz", "/readyz"} {
						resp, err := http.Get(srv.URL + p)
						if err != nil {
							t.Error(err)
							return
						}
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				}
			}
		})
	}
	wg.Wait()
}

// logCatcher is a slog.Handler that hands each record's "addr" to a channel.
type logCatcher struct{ addrs chan string }

func (l logCatcher) Enabled(context.Context, slog.Level) bool { return true }
func (l logCatcher) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l logCatcher) WithGroup(string) slog.Handler            { return l }
func (l logCatcher) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "addr" {
			select {
			case l.addrs <- a.Value.String():
			default:
			}
		}
		return true
	})
	return nil
}

// startServe runs Serve on 127.0.0.1:0 and returns its address and result.
func startServe(t *testing.T, ctx context.Context, h http.Handler) (string, chan error) {
	t.Helper()
	addrs := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, "127.0.0.1:0", h, slog.New(logCatcher{addrs})) }()
	select {
	case addr := <-addrs:
		return addr, done
	case err := <-done:
		t.Fatalf("Serve: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not log its address")
	}
	return "", nil
}

func TestServe(t *testing.T) {
	a, _ := newTestAgent(nil)
	a.SyncDone("success", time.Millisecond)
	a.Ready()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, done := startServe(t, ctx, a.Handler())

	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "ok\n" {
		t.Errorf("/readyz = %d %q", resp.StatusCode, body)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve after cancel: %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Error("still listening after Serve returned")
	}
}

func TestServeBindError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() { done <- Serve(context.Background(), ln.Addr().String(), http.NotFoundHandler(), quietLogger()) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "address already in use") {
			t.Errorf("Serve on a taken port: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve on a taken port did not return")
	}
}

func TestServeDisabled(t *testing.T) {
	if err := Serve(context.Background(), "", http.NotFoundHandler(), quietLogger()); err != nil {
		t.Errorf("Serve with an empty address: %v", err)
	}
}

func TestServeShutdownIsBounded(t *testing.T) {
	old := shutdownTimeout
	shutdownTimeout = 200 * time.Millisecond
	defer func() { shutdownTimeout = old }()

	release := make(chan struct{})
	defer close(release)
	started := make(chan struct{})
	hang := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, done := startServe(t, ctx, hang)
	go func() {
		if resp, err := http.Get("http://" + addr + "/"); err == nil {
			resp.Body.Close()
		}
	}()
	<-started
	begin := time.Now()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
		if took := time.Since(begin); took < shutdownTimeout {
			t.Errorf("Serve returned after %v, before the shutdown timeout, with a request in flight", took)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve's shutdown was not bounded")
	}
}

// TestConfigGauges: config_last_reload_successful follows the last load,
// and config_info has one series, the hash of the config in force.
func TestConfigGauges(t *testing.T) {
	a, _ := newTestAgent(nil)
	line := func(prefix string) string {
		_, _, body := get(t, a.Handler(), "GET", "/metrics")
		for _, l := range strings.Split(body, "\n") {
			if strings.HasPrefix(l, prefix) {
				return l
			}
		}
		return ""
	}
	for _, step := range []struct{ result, want string }{
		{"success", "1"}, {"error", "0"}, {"missing", "1"}, {"error", "0"}, {"success", "1"},
	} {
		a.ConfigLoaded(step.result)
		if got := line("ip_masq_agent_config_last_reload_successful "); got != "ip_masq_agent_config_last_reload_successful "+step.want {
			t.Errorf("after %s: %q, want %s", step.result, got, step.want)
		}
	}
	a.ConfigApplied("aaaa")
	a.ConfigApplied("bbbb")
	if got := line(`ip_masq_agent_config_info{`); got != `ip_masq_agent_config_info{hash="bbbb"} 1` {
		t.Errorf("config_info: %q", got)
	}
	if got := line(`ip_masq_agent_config_info{hash="aaaa"}`); got != "" {
		t.Errorf("the old hash stays: %q", got)
	}
}

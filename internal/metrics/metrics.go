package metrics

import (
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

const namespace = "ip_masq_agent"

// Label values the agent uses; series for them exist from the start at 0.
var (
	syncResults   = []string{"success", "error"}
	configResults = []string{"success", "error", "missing"}
	repairKinds   = []string{"table-deleted", "chain-changed", "set-changed", "other"}
)

// syncBuckets suit a sync of 100 µs (nothing to do) to 5 s (a huge set).
var syncBuckets = []float64{
	0.0001, 0.00025, 0.0005,
	0.001, 0.0025, 0.005,
	0.01, 0.025, 0.05,
	0.1, 0.25, 0.5,
	1, 2.5, 5,
}

// RuleCounter is nft's: one kind of SNAT decision the kernel counts.
type RuleCounter = nft.RuleCounter

// Agent holds the agent's metrics in a private registry and its health
// state, and serves both through Handler. Its methods are safe for
// concurrent use.
type Agent struct {
	reg     *prometheus.Registry
	handler http.Handler
	log     *slog.Logger
	now     func() time.Time // the clock; tests replace it
	rules   *ruleCollector

	syncs       *prometheus.CounterVec
	syncSeconds prometheus.Histogram
	lastSuccess prometheus.Gauge
	configLoads *prometheus.CounterVec
	configOK    prometheus.Gauge
	configOKAt  prometheus.Gauge
	configInfo  *prometheus.GaugeVec
	cidrs       *prometheus.GaugeVec
	intervals   *prometheus.GaugeVec
	repairs     *prometheus.CounterVec
	rival       prometheus.Gauge
	waiting     prometheus.Gauge
	ctDeleted   prometheus.Counter
	legacyRules *prometheus.GaugeVec
	differences *prometheus.GaugeVec
	switchOther *prometheus.GaugeVec
	snatLinks   *prometheus.GaugeVec

	mu     sync.Mutex
	health healthState
}

// healthState is what /healthz and /readyz answer from; guarded by Agent.mu.
type healthState struct {
	start      time.Time     // New's time: the start-up grace counts from it
	beat       time.Time     // the loop's last turn (Alive); zero before the first
	stuckAfter time.Duration // the loop is stuck when it has not turned for longer; 0: never
	verified   bool          // the kernel was found holding the config's table
	notReady   string        // why not, one line; "" once verified
}

// New returns an Agent whose build_info carries version, and whose rule
// counters are read from the kernel through readCounters at each scrape
// (once per scrape, never concurrently with itself; nil: no rule counters).
func New(version string, readCounters func() ([]RuleCounter, error)) *Agent {
	if version == "" {
		version = "unknown"
	}
	a := &Agent{
		reg: prometheus.NewRegistry(),
		log: slog.Default(),
		now: time.Now,
		syncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace,
			Name:      "syncs_total",
			Help:      "Syncs of the rules to the kernel, by result (success or error).",
		}, []string{"result"}),
		syncSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace,
			Name:      "sync_duration_seconds",
			Help:      "How long a sync of the rules to the kernel took, successful or not.",
			Buckets:   syncBuckets,
		}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace,
			Name:      "last_successful_sync_timestamp_seconds",
			Help:      "Unix time of the last successful sync; 0 before the first one.",
		}),
		configLoads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace,
			Name:      "config_loads_total",
			Help:      "Loads of the config file, by result (success, error: kept the previous config, missing: defaults).",
		}, []string{"result"}),
		configOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace,
			Name:      "config_last_reload_successful",
			Help:      "1 when the last load of the config succeeded (a missing file counts: the defaults are in force), 0 when it failed and the previous rules stay in force.",
		}),
		configOKAt: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace,
			Name:      "config_last_reload_success_timestamp_seconds",
			Help:      "Unix time of the last successful load of the config; 0 before the first one.",
		}),
		configInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace,
			Name:      "config_info",
			Help:      "Always 1; hash is that of the config in force in the kernel (the same config and flags give the same hash on every node): count by (hash) shows how far a ConfigMap change has spread.",
		}, []string{"hash"}),
		cidrs: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace,
			Name:      "cidrs",
			Help:      "CIDRs in the config for a set, by set, family and kind (masquerade or nonmasquerade).",
		}, []string{"set", "family", "kind"}),
		intervals: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace,
			Name:      "intervals",
			Help:      "Intervals in the kernel's set: one per CIDR not inside another (adjacent ones joined where the kernel's interval lookup is the array's: Linux 7.0, 6.18.14, 6.19.4 and later), by set, family and kind.",
		}, []string{"set", "family", "kind"}),
		repairs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace,
			Name:      "repairs_total",
			Help:      "Changes to the agent's table by someone else that a sync undid, by what was changed.",
		}, []string{"what"}),
		ctDeleted: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace,
			Name:      "conntrack_entries_deleted_total",
			Help:      "Conntrack entries deleted because a config change made their masquerade decision wrong (--conntrack-cleanup).",
		}),
		legacyRules: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace,
			Name:      "legacy_rules",
			Help:      "1 while the original (iptables) ip-masq-agent's chain or POSTROUTING jump is in the node's iptables-nft nat table of the family, else 0.",
		}, []string{"family"}),
		differences: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace,
			Name:      "original_decision_differences",
			Help:      "Destination ranges (merged) that the original (iptables) ip-masq-agent's rules found on the node and this agent decide differently (masquerade or not), by family; 0 when they agree or no original rules are there.",
		}, []string{"family"}),
		switchOther: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace,
			Name:      "original_switch_other_changes",
			Help:      "Changes the switch from the original (iptables) ip-masq-agent's rules found on the node makes besides differing destination ranges, by family: one for each change of the masquerade's source ports (--to-ports, --random-fully), and one when a rule of the original's compares destinations in a way whose ranges are not known (original_decision_differences may then miss ranges); 0 when none.",
		}, []string{"family"}),
		snatLinks: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace,
			Name:      "snat_address_interfaces",
			Help:      "Interfaces of the node that hold the config's snat address (key: snatAddress or snatAddressIPv6), through which its traffic leaves from that address; 0: none, its traffic is masqueraded to the out interface's address. Absent without the key.",
		}, []string{"key"}),
		rival: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace,
			Name:      "rival_writer",
			Help:      "1 while another process owns the agent's table or keeps rewriting it (a second agent?), else 0.",
		}),
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace,
			Name:      "waiting_for_owner",
			Help:      "1 while another process owns the agent's table and the agent waits for it to exit (it counts no failed sync meanwhile), else 0.",
		}),
	}
	a.health.start = a.now()
	a.health.stuckAfter = StuckAfter
	a.rules = &ruleCollector{read: readCounters, log: a.log}
	for _, r := range syncResults {
		a.syncs.WithLabelValues(r)
	}
	for _, r := range configResults {
		a.configLoads.WithLabelValues(r)
	}
	for _, w := range repairKinds {
		a.repairs.WithLabelValues(w)
	}
	for _, f := range []string{"ipv4", "ipv6"} {
		a.legacyRules.WithLabelValues(f)
		a.differences.WithLabelValues(f)
		a.switchOther.WithLabelValues(f)
	}
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace:   namespace,
		Name:        "build_info",
		Help:        "Always 1; the label carries the agent's version.",
		ConstLabels: prometheus.Labels{"version": version},
	})
	buildInfo.Set(1)
	a.reg.MustRegister(
		buildInfo,
		a.syncs, a.syncSeconds, a.lastSuccess, a.configLoads, a.configOK, a.configOKAt, a.configInfo,
		a.cidrs, a.intervals, a.repairs, a.rival, a.waiting, a.ctDeleted, a.legacyRules, a.differences, a.switchOther, a.snatLinks,
		a.rules,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	a.handler = a.newHandler()
	return a
}

// SyncDone counts a sync and its duration. result is "success" or "error"
// (anything but "success" is a failure); a success also sets the last
// successful sync's time. Health is the agent's to say (Ready, NotReady,
// Alive).
func (a *Agent) SyncDone(result string, took time.Duration) {
	a.syncs.WithLabelValues(result).Inc()
	a.syncSeconds.Observe(max(took, 0).Seconds())
	if result == "success" {
		a.lastSuccess.Set(float64(a.now().UnixNano()) / 1e9)
	}
}

// StuckAfter is how long the loop may go without a turn before /healthz
// fails. The loop turns at least every 10 s; one sync can take up to
// about a minute on a slow node (stale retries are bounded by 30 s, a
// kernel answer by 30 s).
const StuckAfter = 2 * time.Minute

// maxReason bounds a health body's reason, in bytes.
const maxReason = 300

// Ready makes /readyz good: the kernel was found holding the config's table.
func (a *Agent) Ready() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.health.verified, a.health.notReady = true, ""
}

// NotReady makes /readyz fail with reason (one line): the kernel's table
// is not known to be the config's (a failed sync, a config not applied,
// another process owning the table).
func (a *Agent) NotReady(reason string) {
	reason = oneLine(reason, maxReason)
	if reason == "" {
		reason = "not ready"
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.health.verified, a.health.notReady = false, reason
}

// Alive records a turn of the agent's loop, which /healthz reports.
func (a *Agent) Alive() {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.health.beat = now
}

// SetStuckAfter makes /healthz fail when the loop has not turned (Alive)
// for longer than d. 0 or less: never.
func (a *Agent) SetStuckAfter(d time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.health.stuckAfter = max(d, 0)
}

// ConfigLoaded counts a load of the config file: result is "success",
// "error" (the previous config stays in force) or "missing" (no file:
// defaults). It does not touch health; see the package comment.
//
// It also sets config_last_reload_successful: 1 after "success" or
// "missing", 0 after anything else.
func (a *Agent) ConfigLoaded(result string) {
	a.configLoads.WithLabelValues(result).Inc()
	if result == "success" || result == "missing" {
		a.configOK.Set(1)
		a.configOKAt.Set(float64(a.now().UnixNano()) / 1e9)
		return
	}
	a.configOK.Set(0)
}

// ConfigApplied says which config is in force in the kernel: config_info
// then has one series, with hash.
func (a *Agent) ConfigApplied(hash string) {
	a.configInfo.Reset()
	a.configInfo.WithLabelValues(hash).Set(1)
}

// SetElements sets the number of CIDRs in the config for a set and the
// number of intervals they became in the kernel's set. family is "ipv4" or
// "ipv6"; kind is "masquerade" or "nonmasquerade".
func (a *Agent) SetElements(set string, family string, kind string, cidrs, intervals int) {
	a.cidrs.WithLabelValues(set, family, kind).Set(float64(cidrs))
	a.intervals.WithLabelValues(set, family, kind).Set(float64(intervals))
}

// Repaired counts a foreign change to the agent's table that a sync undid;
// what is "table-deleted", "chain-changed", "set-changed" or "other".
func (a *Agent) Repaired(what string) {
	a.repairs.WithLabelValues(what).Inc()
}

// ConntrackDeleted counts conntrack entries deleted by a cleanup.
func (a *Agent) ConntrackDeleted(n int) { a.ctDeleted.Add(float64(max(n, 0))) }

// SNATInterfaces says how many interfaces hold the snat address of key
// (snatAddress or snatAddressIPv6); set false: the config has none.
func (a *Agent) SNATInterfaces(key string, n int, set bool) {
	if !set {
		a.snatLinks.DeleteLabelValues(key)
		return
	}
	a.snatLinks.WithLabelValues(key).Set(float64(n))
}

// LegacyRules says whether the original agent's rules are in the node's
// iptables-nft nat table of family ("ipv4" or "ipv6").
func (a *Agent) LegacyRules(family string, present bool) {
	v := 0.0
	if present {
		v = 1
	}
	a.legacyRules.WithLabelValues(family).Set(v)
}

// OriginalDecisionDifferences sets the number of destination ranges of
// family ("ipv4" or "ipv6") that the original agent's rules and this
// agent decide differently.
func (a *Agent) OriginalDecisionDifferences(family string, n int) {
	a.differences.WithLabelValues(family).Set(float64(max(n, 0)))
}

// OriginalSwitchOtherChanges sets the switch's changes of a family
// besides its differing ranges (original.Comparison.Others).
func (a *Agent) OriginalSwitchOtherChanges(family string, n int) {
	a.switchOther.WithLabelValues(family).Set(float64(max(n, 0)))
}

// RivalWriter says whether another process owns the table or keeps
// rewriting it.
func (a *Agent) RivalWriter(yes bool) {
	v := 0.0
	if yes {
		v = 1
	}
	a.rival.Set(v)
}

// WaitingForOwner says whether another process owns the table and the
// agent waits for it to exit: a state of its own, not a failed sync.
func (a *Agent) WaitingForOwner(yes bool) {
	v := 0.0
	if yes {
		v = 1
	}
	a.waiting.Set(v)
}

// healthz returns /healthz's answer (liveness: the loop turns), whether
// healthy, and a one-line body.
func (a *Agent) healthz() (bool, string) {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	h := a.health
	last, what := h.beat, "the agent's loop has not turned for %s (stuck after %s)"
	if last.IsZero() {
		last, what = h.start, "the agent's loop has not started in %s (stuck after %s)"
	}
	if h.stuckAfter > 0 && now.Sub(last) > h.stuckAfter {
		return false, fmt.Sprintf(what, now.Sub(last).Round(time.Second), h.stuckAfter)
	}
	return true, "ok"
}

// readyz returns /readyz's answer: ready while the kernel was last found
// holding the config's table.
func (a *Agent) readyz() (bool, string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.health.verified:
		return true, "ok"
	case a.health.notReady != "":
		return false, a.health.notReady
	}
	return false, "no config applied yet"
}

// oneLine folds s onto one line (each run of white space or control
// characters becomes one space), makes it valid UTF-8 and cuts it to at most
// limit bytes, ending in "..." when cut.
func oneLine(s string, limit int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.Join(strings.FieldsFunc(s, func(r rune) bool {
		return r == ' ' || r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) ||
			r == '\u2028' || r == '\u2029' || r == '\u0085'
	}), " ")
	if len(s) <= limit {
		return s
	}
	cut := limit - len("...")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// ruleCollector reads the rules' counters from the kernel at each scrape.
type ruleCollector struct {
	read func() ([]RuleCounter, error)
	log  *slog.Logger

	mu      sync.Mutex // one read at a time; guards the fields below
	errors  uint64     // failed reads
	lastErr string     // the last read's error, "" after a good read: log changes only
}

var (
	rulePacketsDesc = prometheus.NewDesc(
		prometheus.BuildFQName(namespace, "", "rule_packets_total"),
		"Packets counted by the agent's rules in the kernel, by family, decision (masquerade or nonmasquerade) and reason (cidrs, sources, interfaces or outbound).",
		[]string{"family", "decision", "reason"}, nil)
	ruleBytesDesc = prometheus.NewDesc(
		prometheus.BuildFQName(namespace, "", "rule_bytes_total"),
		"Bytes counted by the agent's rules in the kernel, by family, decision (masquerade or nonmasquerade) and reason (cidrs, sources, interfaces or outbound).",
		[]string{"family", "decision", "reason"}, nil)
	readErrorsDesc = prometheus.NewDesc(
		prometheus.BuildFQName(namespace, "", "rule_counters_read_errors_total"),
		"Scrapes that could not read the rules' counters from the kernel (and so had no rule_packets_total or rule_bytes_total).",
		nil, nil)
)

// Describe implements prometheus.Collector.
func (c *ruleCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- rulePacketsDesc
	ch <- ruleBytesDesc
	ch <- readErrorsDesc
}

// Collect implements prometheus.Collector: it reads the counters once.
func (c *ruleCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var (
		rcs []RuleCounter
		err error
	)
	if c.read != nil {
		rcs, err = c.readOnce()
	}
	if err != nil {
		c.errors++
		if msg := err.Error(); msg != c.lastErr {
			c.lastErr = msg
			c.log.Warn("cannot read the rules' counters for /metrics", "err", err)
		}
		ch <- constCounter(readErrorsDesc, c.errors)
		return
	}
	if c.lastErr != "" {
		c.lastErr = ""
		c.log.Info("reading the rules' counters for /metrics again")
	}
	ch <- constCounter(readErrorsDesc, c.errors)

	// Several rules with the same labels add up: one series each.
	type key struct{ family, decision, reason string }
	sums := make(map[key]RuleCounter, len(rcs))
	for _, rc := range rcs {
		k := key{rc.Family, rc.Decision, rc.Reason}
		s := sums[k]
		s.Packets += rc.Packets
		s.Bytes += rc.Bytes
		sums[k] = s
	}
	for k, s := range sums {
		ch <- constCounter(rulePacketsDesc, s.Packets, k.family, k.decision, k.reason)
		ch <- constCounter(ruleBytesDesc, s.Bytes, k.family, k.decision, k.reason)
	}
}

// constCounter is a counter's value at this scrape; label values that are not
// valid (not UTF-8) make an invalid metric, an error of this scrape that
// promhttp logs and skips, rather than a panic.
func constCounter(desc *prometheus.Desc, v uint64, labels ...string) prometheus.Metric {
	m, err := prometheus.NewConstMetric(desc, prometheus.CounterValue, float64(v), labels...)
	if err != nil {
		return prometheus.NewInvalidMetric(desc, err)
	}
	return m
}

// readOnce calls read, turning a panic into an error: a scrape must not
// take the agent down.
func (c *ruleCollector) readOnce() (rcs []RuleCounter, err error) {
	defer func() {
		if p := recover(); p != nil {
			rcs, err = nil, fmt.Errorf("panic: %v", p)
		}
	}()
	return c.read()
}

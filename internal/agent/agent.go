// Package agent is the daemon's one loop: config file events, the resync
// deadline, kernel events, verification and repair, backoff and health.
// It talks to the kernel only through the Kernel interface, so that it is
// tested against nft.Fake without privileges.
package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/metrics"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
	"github.com/ip-masq-agent/ip-masq-agent-nft/original"
)

// Kernel is nft.Kernel and its notifications.
type Kernel interface {
	nft.Kernel
	// Watch calls notify after every transaction that may have touched
	// the table, and when notifications were lost, until ctx is done.
	Watch(ctx context.Context, notify func(nft.Event)) error
}

// OriginalRules finds and removes the original (iptables) ip-masq-agent's
// rules; kernel.Netlink and nft.Fake have it.
type OriginalRules interface {
	FindOriginal(chain string) (original.Rules, error)
	// RemoveOriginal removes those of the families given (none: both).
	RemoveOriginal(chain, fingerprint string, families ...nft.Family) (original.Rules, error)
}

// IntervalLookup says whether the kernel's interval sets look up in an
// array built at each commit, from its answer (kernel.Netlink has it):
// then adjacent CIDRs are joined (nft.Options.MergeAdjacent). An error:
// the kernel could not say; asked again at the next sync.
type IntervalLookup interface {
	IntervalLookup() (array bool, err error)
}

// Options are what the agent is run with.
type Options struct {
	ConfigPath string
	Flags      config.Flags
	NFT        nft.Options
	// Watch subscribes to the kernel's notifications, so that a change
	// by another process is repaired at once rather than at the next
	// resync. Not needed when the agent owns the table.
	Watch bool
	// Once: one sync, then exit (--once): a table owned by another
	// process is not waited for.
	Once bool
	// Applied, if set, is called after the kernel took a new table that
	// may change the decision for some destinations (the conntrack cleanup).
	Applied func(old, new nft.Table)
	// Original finds and removes the original agent's rules; nil: they
	// are not looked for.
	Original OriginalRules
	// Loader reads the config; nil: the agent's own. The daemon shares
	// the one it read the config with at start (for its kernel probe), so
	// that the first sync parses no unchanged file again.
	Loader *config.Loader
}

// Agent keeps the kernel's table in line with the config.
type Agent struct {
	opts    Options
	kernel  Kernel
	log     *slog.Logger
	metrics *metrics.Agent
	loader  *config.Loader

	cfg            *config.Config // the config last put in the kernel
	want           *nft.Table     // and its table
	snat           []nft.SNATLink // and the interfaces that held its snat addresses
	snatMissing    []string       // the snat addresses on no interface, last warned about
	deadline       time.Time      // the next resync; only a successful sync moves it
	failures       int            // consecutive failed syncs
	retryAt        time.Time      // the next try after a failed sync
	repairAt       time.Time      // a pending verification after a kernel event; zero: none
	repairFailures int            // consecutive failed repairs, for their backoff
	repairs        []time.Time    // when recent repairs had to write, for rival detection
	rival          time.Duration  // the current back-off against a rival writer; 0: none
	waiting        bool           // another process owns the table (logged once)
	lookupKnown    bool           // the kernel said which interval lookup it has
	lookupFailed   bool           // it did not answer once (logged)
	askLookup      bool           // it did not answer, and the config has adjacent CIDRs: ask at the next sync
	merge          bool           // and it is the array's: adjacent CIDRs are joined
	merged         bool           // want was built so

	lastWarnings []string
	lastErr      string

	configBad bool   // the last load of the config failed (not a partial directory)
	refused   bool   // a config was refused since the last one applied: log the recovery
	notReady  string // why the kernel's table is not the config's, though it was verified
	original  originalState
}

// New returns an agent; log and m must not be nil.
func New(o Options, k Kernel, log *slog.Logger, m *metrics.Agent) *Agent {
	a := &Agent{opts: o, kernel: k, log: log, metrics: m, loader: o.Loader}
	if a.loader == nil {
		a.loader = &config.Loader{}
	}
	return a
}

// Rival detection: this many repairs that had to write, within the window,
// mean another process keeps rewriting the table.
const (
	rivalRepairs = 3
	rivalWindow  = 10 * time.Second
	// ownedRetry is how often an agent that finds the table owned by
	// another process looks again (the owner's exit orphans it). A look
	// reads only the table's flags and owner.
	ownedRetry = time.Second
	// heartbeat is how often the loop turns at the least, for /healthz.
	heartbeat = 10 * time.Second
)

// Run syncs now, then on every config change, every kernel event and
// every resync deadline, until ctx is done.
func (a *Agent) Run(ctx context.Context, fileChanged <-chan struct{}) {
	events := make(chan nft.Event, 1)
	if a.opts.Watch {
		go a.watch(ctx, events)
	}
	a.deadline = time.Now().Add(a.interval())
	a.Sync(time.Now())
	for {
		a.metrics.Alive()
		wait := min(time.Until(a.next()), heartbeat)
		timer := time.NewTimer(max(wait, 0))
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-fileChanged:
			a.log.Debug("config file changed")
			a.Sync(time.Now())
		case ev := <-events:
			a.KernelEvent(ev, time.Now())
		case now := <-timer.C:
			a.Tick(now)
		}
		timer.Stop()
	}
}

// watch runs the kernel's watch, restarting it with backoff if it fails.
func (a *Agent) watch(ctx context.Context, events chan<- nft.Event) {
	for backoff := time.Second; ctx.Err() == nil; backoff = min(2*backoff, time.Minute) {
		err := a.kernel.Watch(ctx, func(e nft.Event) {
			select {
			case events <- e:
			default: // a verification is pending already; it covers this event too
			}
		})
		if ctx.Err() != nil {
			return
		}
		a.log.Error("watching nftables failed; relying on the resync interval until it works again", "err", err, "retry in", backoff)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
	}
}

// next returns when the loop has something to do next: after a failed
// sync, the retry (its backoff is capped at the interval); otherwise the
// resync deadline; and a pending verification, if sooner.
func (a *Agent) next() time.Time {
	t := a.deadline
	if a.failures > 0 {
		t = a.retryAt
	}
	if !a.repairAt.IsZero() && a.repairAt.Before(t) {
		t = a.repairAt
	}
	if c := a.original.checkAt; !c.IsZero() && c.Before(t) {
		t = c
	}
	return t
}

// Tick does what is due at now: a pending repair, a retry, the resync.
func (a *Agent) Tick(now time.Time) {
	if !a.repairAt.IsZero() && !now.Before(a.repairAt) {
		a.repair(now)
	}
	if due := a.deadline; a.failures > 0 {
		if !now.Before(a.retryAt) {
			a.Sync(now)
		}
	} else if !now.Before(due) {
		a.Sync(now)
	}
	if c := a.original.checkAt; !c.IsZero() && !now.Before(c) {
		a.checkOriginal(now)
	}
}

// KernelEvent schedules a verification of the table: at once, or after the
// back-off against a rival writer.
func (a *Agent) KernelEvent(ev nft.Event, now time.Time) {
	a.log.Debug("nftables event", "what", ev.What, "lost", ev.Lost)
	if !a.repairAt.IsZero() {
		return // one is pending
	}
	a.repairAt = now.Add(a.rival)
	if a.rival == 0 {
		a.repair(now)
	}
}

// interval is the resync interval in force.
func (a *Agent) interval() time.Duration {
	if a.cfg != nil {
		return a.cfg.ResyncInterval
	}
	return config.Default(a.opts.Flags).ResyncInterval
}

// Sync loads the config and makes the kernel hold its table. On a bad
// config the kernel keeps what it has. Only a successful sync moves the
// resync deadline and resets the failure backoff. Every sync also looks
// for the original agent's rules (original.go).
func (a *Agent) Sync(now time.Time) error {
	err := a.sync(now)
	a.checkOriginal(now)
	return err
}

func (a *Agent) sync(now time.Time) error {
	cfg, partial, err := a.load()
	if err != nil && !partial {
		return a.keepLastGood(now, err)
	}
	return a.apply(now, cfg, partial)
}

// load loads the config, logs its warnings when they change, and counts
// the load. partial: some files of a config directory are bad, and cfg
// is the merge of the others with the bad ones' last good content.
func (a *Agent) load() (cfg config.Config, partial bool, err error) {
	cfg, warnings, err := a.loader.Load(a.opts.ConfigPath, a.opts.Flags)
	partial = config.IsPartial(err)
	a.configBad = err != nil && !partial
	if a.configBad {
		a.refused = true
	}
	if !slices.Equal(warnings, a.lastWarnings) {
		for _, w := range warnings {
			a.log.Warn(w)
		}
		a.lastWarnings = warnings
	}
	a.notReady = ""
	switch _, serr := os.Stat(a.opts.ConfigPath); {
	case partial:
		a.metrics.ConfigLoaded("error")
		a.logError("config file not applied; its last good content stays in force with the other files", err)
		a.notReady = "config not applied: " + err.Error() + "; its last good content stays in force with the other files"
	case err != nil:
		a.metrics.ConfigLoaded("error")
	case errors.Is(serr, fs.ErrNotExist):
		a.metrics.ConfigLoaded("missing")
	default:
		a.metrics.ConfigLoaded("success")
	}
	return cfg, partial, err
}

// keepLastGood handles a bad config: the kernel keeps the last good
// config's table, verified (a bad ConfigMap is no reason for the kubelet
// to restart the agent), but the agent is not ready.
func (a *Agent) keepLastGood(now time.Time, err error) error {
	// Not ready before the log line says why: whoever reads the line and
	// then /readyz sees both agree.
	if a.want == nil {
		a.metrics.NotReady("no config applied yet: " + err.Error())
		a.logError("config not applied; the rules in the kernel are unchanged", err)
		a.failed(now, err)
		return err
	}
	a.notReady = "config not applied: " + err.Error() + "; the last good config's table stays in force"
	a.metrics.NotReady(a.notReady)
	a.logError("config not applied; the rules in the kernel are unchanged", err)
	a.failed(now, err)
	start := time.Now()
	if res, kerr := nft.EnsureBy(a.kernel, *a.want, a.retryBy(now)); kerr == nil {
		a.metrics.SyncDone("success", time.Since(start))
		a.metrics.NotReady(a.notReady)
		a.wrote(res, *a.want)
	} else {
		a.kernelFailed(now, kerr, time.Since(start))
	}
	return err
}

// apply makes the kernel hold cfg's table, and says what it did.
func (a *Agent) apply(now time.Time, cfg config.Config, partial bool) error {
	// A resync of an unchanged config: 100,000 CIDRs take about 10 ms to
	// build, hash and count, and the DaemonSet may run under a CPU limit.
	// The node's interfaces that hold the snat addresses are looked up
	// at every sync (only with a snat address): one that appears, moves
	// or goes rebuilds the table.
	o := a.opts.NFT
	o.MergeAdjacent = a.merge
	snat := nft.SNATLinks(cfg, o)
	same := a.cfg != nil && a.cfg.Equal(cfg) && slices.Equal(snat, a.snat) && a.merged == o.MergeAdjacent && !a.askLookup
	a.warnSNAT(cfg, snat)
	var want nft.Table
	if same {
		want = *a.want
	} else {
		want = nft.Build(cfg, o)
		// Which interval lookup the kernel has matters only when there
		// is something to join: asked then (a table of its own, two
		// commits), and again at each sync until the kernel answers.
		if a.askLookup = !a.lookupKnown && want.HasAdjacent(); a.askLookup {
			if a.learnLookup(); a.lookupKnown {
				a.askLookup = false
				if a.merge {
					o.MergeAdjacent = true
					want = nft.Build(cfg, o)
				}
			}
		}
	}
	start := time.Now()
	res, err := nft.EnsureBy(a.kernel, want, a.retryBy(now))
	if err != nil {
		a.kernelFailed(now, err, time.Since(start))
		return err
	}
	took := time.Since(start)
	a.adopted()
	a.failures = 0
	a.verified()
	a.metrics.SyncDone("success", took)
	if !same {
		a.setElements(cfg, want)
		a.metrics.ConfigApplied(cfg.Hash())
	}
	if !partial {
		a.lastErr = ""
	}
	// A join alone (the kernel said late that it allows it) changes no
	// decision: no conntrack cleanup.
	joined := !same && a.cfg != nil && a.cfg.Equal(cfg) && a.merged != o.MergeAdjacent && !res.Unchanged &&
		res.Found != nil && joinedOnly(*res.Found, *a.want)
	a.logApplied(now, cfg, want, res, took, partial, joined)
	if !joined {
		a.wrote(res, want)
	}
	a.cfg, a.want, a.snat, a.merged = &cfg, &want, snat, o.MergeAdjacent
	a.deadline = now.Add(cfg.ResyncInterval)
	return nil
}

// joinedOnly reports whether the kernel's table found before a sync was
// apart, the table last applied with adjacent CIDRs apart: nothing but the
// join changed it.
func joinedOnly(found, apart nft.Table) bool {
	apart.Owner, apart.Dormant = found.Owner, found.Dormant
	return apart.Equal(found)
}

// learnLookup asks the kernel, until it can say, which interval-set
// lookup it has: the array's, built at each commit, lets the sets join
// adjacent CIDRs into one element (fewer elements for every nft batch on
// the node to read, and for each of our commits to rebuild); the tree's
// does not (nft/prefix.go's paint says why). Asked before a table with
// adjacent CIDRs is written, so that it is written once as the kernel
// allows.
func (a *Agent) learnLookup() {
	l, ok := a.kernel.(IntervalLookup)
	if !ok || a.lookupKnown {
		return
	}
	array, err := l.IntervalLookup()
	if err != nil {
		// Asked again at the next sync (a socket, a table created and
		// deleted); said once.
		if !a.lookupFailed {
			a.lookupFailed = true
			a.log.Info("the kernel did not say which interval-set lookup it has; adjacent CIDRs stay apart, asked again at each sync", "err", err)
		}
		return
	}
	a.lookupKnown, a.merge = true, array
	if array {
		a.log.Info("the kernel's interval sets look up in an array built at each commit (its answer to a get): adjacent CIDRs of a set are joined into one element")
	} else {
		a.log.Info("the kernel's interval sets look up in a tree (its answer to a get): each listed CIDR keeps its own set element, so that no change moves the start of another's interval")
	}
}

// logApplied says what a successful sync found and did.
func (a *Agent) logApplied(now time.Time, cfg config.Config, want nft.Table, res nft.Result, took time.Duration, partial, joined bool) {
	same := a.cfg != nil && a.cfg.Equal(cfg)
	attrs := []any{"took", took.Round(time.Microsecond), "messages", res.Messages, "bytes", res.Bytes}
	for _, s := range want.Sets {
		attrs = append(attrs, s.Name, len(s.Elements))
	}
	adopted := len(res.Plan.Ops) == 1 && res.Plan.Ops[0].Kind == nft.KindTable && res.Plan.Ops[0].Verb == nft.Update
	switch {
	case a.cfg == nil && (res.Unchanged || adopted):
		a.log.Info("the kernel holds the config's table already; took it over without changing its contents", append(attrs, "adopted", adopted)...)
	case a.cfg == nil:
		a.log.Info("applied config", append(attrs, "created", res.Created, "recreated", res.Recreated)...)
	case !same:
		a.log.Info("applied new config", append(attrs, "changes", strings.Join(cfg.Diff(*a.cfg), "; "))...)
	case joined:
		a.log.Info("joined adjacent CIDRs into one set element each; no decision changed", attrs...)
	case res.Unchanged:
		a.log.Debug("resync: the table read back is the wanted one; nothing sent")
	default:
		a.reportRepair(res, now, "resync")
	}
	if res.Undone > 0 && !same {
		// Another process changed the table between our commit and the
		// read that verified it: its notifications were drained by that
		// read, so no watch event will follow. Say so, as a repair.
		// (The last transaction created the table: it was deleted.)
		a.reportRepairOf(repairKind(res.Created, res.Plan), res.Plan, now, "apply")
	}
	if a.refused && !partial {
		a.refused = false
		// The ERROR "config not applied" must not stay the last word
		// while /readyz is good again.
		a.log.Info("config is good again; applied", "config", a.opts.ConfigPath, "hash", cfg.Hash())
	}
	if res.Recreated {
		a.log.Warn("re-created the table in one transaction", "why", res.Plan.Why)
	}
	if !same && a.log.Enabled(context.Background(), slog.LevelDebug) {
		// The whole ruleset, when it is small enough to read in a log:
		// 100,000 CIDRs render to 2 MB and take a second of a 100m limit.
		if n := elements(want); n <= maxRenderedElements {
			a.log.Debug("table", "nft", nft.Render(want))
		} else {
			a.log.Debug("table not rendered: too many elements (ip-masq-agent list prints it)", "elements", n)
		}
	}
}

// wrote calls the Applied hook (the conntrack cleanup) after an Ensure
// that wrote: the decisions running flows were made with, those of the
// table the kernel held before, may differ from want's.
func (a *Agent) wrote(res nft.Result, want nft.Table) {
	if a.opts.Applied != nil && !res.Unchanged {
		a.opts.Applied(found(res), want)
	}
}

// repair verifies the table against the last good config's, and puts it
// back if it differs. It neither moves the resync deadline nor resets the
// failure backoff, and it does not make a failing agent healthy.
func (a *Agent) repair(now time.Time) {
	a.repairAt = time.Time{}
	if a.want == nil {
		return // nothing applied yet; the sync's retries take care
	}
	start := time.Now()
	res, err := nft.EnsureBy(a.kernel, *a.want, a.retryBy(now))
	if err != nil {
		if errors.Is(err, nft.ErrOwnedByOther) {
			a.ownedByOther(now)
			return
		}
		a.logError("repair failed; retrying", err)
		a.metrics.NotReady("repair failed: " + Hint(err).Error())
		// Back off from the end of the failed attempt, which a slow
		// kernel can make long, by the failures in a row.
		if took := time.Since(start); took > time.Second {
			now = now.Add(took)
		}
		a.repairFailures++
		a.repairAt = now.Add(min(time.Second<<min(a.repairFailures-1, 6), a.interval()))
		return
	}
	a.repairFailures = 0
	a.adopted()
	a.verified()
	if res.Unchanged {
		a.log.Debug("verified the table after an nftables event: unchanged", "took", time.Since(start).Round(time.Microsecond))
		return
	}
	a.reportRepair(res, now, "repair")
	a.wrote(res, *a.want)
}

// found is what the kernel held before an Ensure: the decisions that
// running flows were made with (no table: nothing masqueraded).
func found(res nft.Result) nft.Table {
	if res.Found == nil {
		return nft.Table{}
	}
	return *res.Found
}

// reportRepair logs and counts a write that undid someone else's change,
// and backs off when another process keeps rewriting the table.
func (a *Agent) reportRepair(res nft.Result, now time.Time, by string) {
	a.reportRepairOf(repairKind(res.Found == nil, res.Plan), res.Plan, now, by)
}

func (a *Agent) reportRepairOf(what string, plan nft.Plan, now time.Time, by string) {
	a.log.Warn("the table differed from the wanted one; put it back", "by", by, "what", what,
		"operations", len(plan.Ops), "first", firstOp(plan))
	a.metrics.Repaired(what)
	a.repairs = append(slices.DeleteFunc(a.repairs, func(t time.Time) bool { return now.Sub(t) > rivalWindow }), now)
	switch {
	case len(a.repairs) >= rivalRepairs:
		if a.rival == 0 {
			a.log.Error("another process keeps rewriting table inet "+nft.TableName+"; backing off (is a second agent running?)",
				"rewrites", len(a.repairs), "within", rivalWindow)
		}
		a.rival = min(max(2*a.rival, time.Second), a.interval())
		a.metrics.RivalWriter(true)
	case len(a.repairs) == 1 && a.rival > 0:
		a.log.Info("no rival writer seen lately; repairing at once again")
		a.rival = 0
		a.metrics.RivalWriter(false)
	}
}

// adopted ends a wait for another owner: the table is the agent's again.
func (a *Agent) adopted() {
	if !a.waiting {
		return
	}
	a.log.Info("adopted table inet " + nft.TableName + ": its previous owner is gone")
	a.waiting = false
	a.metrics.RivalWriter(false)
	a.metrics.WaitingForOwner(false)
}

// ownedByOther: another process's socket owns the table. Wait for it to
// exit (its table then stays, orphaned) and adopt it.
func (a *Agent) ownedByOther(now time.Time) {
	if a.opts.Once {
		return // the caller reports it and exits: it does not wait
	}
	a.log.Debug("table inet " + nft.TableName + " is owned by another process; looking again in a second")
	if !a.waiting {
		a.log.Warn("another process owns table inet "+nft.TableName+" (another ip-masq-agent?); waiting for it to exit", "retry every", ownedRetry)
		a.waiting = true
	}
	a.metrics.RivalWriter(true)
	a.metrics.WaitingForOwner(true)
	a.metrics.NotReady("another process owns table inet " + nft.TableName + " (another ip-masq-agent?); waiting for it to exit")
	if a.want != nil {
		a.repairAt = now.Add(ownedRetry)
	}
}

// verified: the kernel was just found holding the last good config's table.
func (a *Agent) verified() {
	if a.failures > 0 {
		return // the last sync failed: its reason stands until one succeeds
	}
	if a.notReady != "" {
		a.metrics.NotReady(a.notReady)
		return
	}
	a.metrics.Ready()
}

// retryBy bounds an Ensure's retries after stale reads and plans (a busy
// node): the next resync, and nft.Patience at the most, so that the loop
// keeps turning.
func (a *Agent) retryBy(now time.Time) time.Time {
	return now.Add(min(a.interval(), nft.Patience))
}

func (a *Agent) failed(now time.Time, err error) {
	a.failures++
	a.retryAt = now.Add(min(a.interval(), time.Second<<min(a.failures-1, 6)))
	if errors.Is(err, nft.ErrOwnedByOther) {
		a.retryAt = now.Add(ownedRetry) // its owner's exit orphans it: adopt it soon after
	}
}

func (a *Agent) kernelFailed(now time.Time, err error, took time.Duration) {
	a.failed(now, err)
	if errors.Is(err, nft.ErrOwnedByOther) {
		// Waiting for the owner to exit is a state of its own
		// (waiting_for_owner), not a failed sync: it looks once a
		// second and would fire the sync-failure alert.
		a.ownedByOther(now)
		return
	}
	a.metrics.SyncDone("error", took)
	err = Hint(err)
	if a.want == nil {
		a.metrics.NotReady("no config applied yet: last sync failed: " + err.Error())
	} else {
		a.metrics.NotReady("last sync failed: " + err.Error())
	}
	a.logError("sync failed; the kernel keeps its previous rules", err)
}

func repairKind(deleted bool, plan nft.Plan) string {
	if deleted {
		return "table-deleted"
	}
	kinds := map[nft.Kind]bool{}
	for _, op := range plan.Ops {
		kinds[op.Kind] = true
	}
	switch {
	case kinds[nft.KindChain] || kinds[nft.KindRule]:
		return "chain-changed"
	case kinds[nft.KindSet] || kinds[nft.KindElements]:
		return "set-changed"
	}
	return "other"
}

func firstOp(p nft.Plan) string {
	if len(p.Ops) == 0 {
		return ""
	}
	s := p.Ops[0].String()
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}

// maxRenderedElements bounds the table logged at debug level.
const maxRenderedElements = 10_000

func elements(t nft.Table) (n int) {
	for _, s := range t.Sets {
		n += len(s.Elements)
	}
	return n
}

// setElements publishes, per set, the CIDRs the config lists and the
// intervals the kernel holds.
func (a *Agent) setElements(cfg config.Config, t nft.Table) {
	count := func(ps []netip.Prefix, is6, names bool) (n int) {
		for _, p := range ps {
			if names || p.Addr().Unmap().Is6() == is6 {
				n++
			}
		}
		return n
	}
	for _, s := range t.Sets {
		kind, list, fam, ok := nft.SetOf(cfg, s.Name)
		if !ok {
			fam = s.Key.Family()
		}
		family, is6 := "ipv4", fam == 6
		if is6 {
			family = "ipv6"
		}
		cidrs := count(list, is6, s.Key.Family() == 0)
		if is6 && !a.opts.Flags.EnableIPv6 {
			cidrs = 0
		}
		a.metrics.SetElements(s.Name, family, kind, cidrs, len(s.Elements))
	}
}

// logError logs an error once until it changes or a sync succeeds.
func (a *Agent) logError(msg string, err error) {
	if err.Error() == a.lastErr {
		a.log.Debug(msg, "err", err)
		return
	}
	a.lastErr = err.Error()
	a.log.Error(msg, "err", err)
}

// Hint adds what an operator needs to know to the errors that need it.
func Hint(err error) error {
	if errors.Is(err, os.ErrPermission) || strings.Contains(err.Error(), "operation not permitted") {
		return fmt.Errorf("%w (the agent needs CAP_NET_ADMIN in the node's network namespace)", err)
	}
	return err
}

// warnSNAT warns, once per change, about a snat address of the config
// that no interface of the node holds: its family is masqueraded to the
// out interface's address, as without it.
func (a *Agent) warnSNAT(cfg config.Config, links []nft.SNATLink) {
	var missing []string
	for _, k := range []struct {
		key  string
		addr netip.Addr
		ok   bool
	}{{config.KeySNAT, cfg.SNATAddress, true}, {config.KeySNAT6, cfg.SNATAddressIPv6, a.opts.NFT.EnableIPv6}} {
		n := 0
		for _, l := range links {
			if l.Addr == k.addr {
				n++
			}
		}
		a.metrics.SNATInterfaces(k.key, n, k.addr.IsValid() && k.ok)
		if k.addr.IsValid() && k.ok && n == 0 {
			missing = append(missing, k.key+" "+k.addr.String())
		}
	}
	if slices.Equal(missing, a.snatMissing) {
		return
	}
	a.snatMissing = missing
	for _, m := range missing {
		a.log.Warn(m + " is on no interface of this node: its traffic is masqueraded to the out interface's address until an interface holds it (looked up at every sync)")
	}
}

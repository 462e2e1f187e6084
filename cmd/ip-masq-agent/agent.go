package main

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/filewatch"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/metrics"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// debounce coalesces a burst of file events (the kubelet's ..data swap is
// several) into one reload.
const debounce = 10 * time.Millisecond

// agent is the daemon's state between syncs.
type agent struct {
	opts    options
	log     *slog.Logger
	applier *nft.Applier
	metrics *metrics.Agent

	loader       config.Loader  // reads --config, a file or a directory of files
	applied      *config.Config // the config last put in the kernel, nil before
	ruleset      *nft.Ruleset   // and its ruleset
	lastWarnings []string       // logged once, not every resync
	lastErr      string         // likewise
	failures     int            // consecutive failed syncs, for backoff
}

// loop syncs now, then on every config file change, every foreign change
// to the table, and every resync interval, until ctx is done. A failed
// sync is retried sooner, with backoff, but never later than the resync
// interval.
func (a *agent) loop(ctx context.Context) {
	onError := func(err error) { a.log.Warn("watching the config file", "err", err) }
	watch := func() (<-chan struct{}, error) {
		return filewatch.Watch(ctx, a.opts.configPath, debounce, onError)
	}
	if fi, err := os.Stat(a.opts.configPath); err == nil && fi.IsDir() {
		// A directory of files (a projected volume of ConfigMaps): config.Loader merges them.
		watch = func() (<-chan struct{}, error) {
			return filewatch.WatchDir(ctx, a.opts.configPath, config.IsConfigName, debounce, onError)
		}
	}
	fileChanged, err := watch()
	if err != nil {
		// The periodic resync still picks changes up.
		a.log.Error("cannot watch the config file; relying on the resync interval", "err", err)
	}
	tampered := make(chan nft.Change, 1)
	go a.watchTable(ctx, tampered)

	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		var repair *nft.Change
		select {
		case <-ctx.Done():
			return
		case <-fileChanged:
			a.log.Debug("config file changed")
		case c := <-tampered:
			repair = &c
		case <-timer.C:
		}
		var err error
		if repair != nil && a.ruleset != nil {
			// The file has not changed (its events come separately):
			// put the last ruleset back without re-reading the file.
			err = a.apply(*a.ruleset)
		} else {
			err = a.sync()
		}
		if repair != nil && err == nil {
			a.log.Warn("undid a change to the table by another process", "change", repair.What)
			a.metrics.Repaired(repairKind(*repair))
		}
		wait := a.interval()
		if err != nil {
			a.failures++
			wait = min(wait, time.Second<<min(a.failures-1, 6))
		} else {
			a.failures = 0
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(wait)
	}
}

// watchTable runs the applier's watch of foreign changes, restarting it
// with backoff if its socket fails.
func (a *agent) watchTable(ctx context.Context, tampered chan<- nft.Change) {
	for backoff := time.Second; ctx.Err() == nil; backoff = min(2*backoff, time.Minute) {
		err := a.applier.Watch(ctx, func(c nft.Change) {
			select {
			case tampered <- c:
			default: // a repair is already pending; it covers this change too
			}
		})
		if ctx.Err() != nil {
			return
		}
		a.log.Error("watching nftables for foreign changes failed; retrying", "err", hint(err), "in", backoff)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
	}
}

func repairKind(c nft.Change) string {
	switch {
	case strings.Contains(c.What, "delete table"):
		return "table-deleted"
	case strings.Contains(c.What, "rule") || strings.Contains(c.What, "chain"):
		return "chain-changed"
	case strings.Contains(c.What, "set") || strings.Contains(c.What, "elements"):
		return "set-changed"
	}
	return "other"
}

func (a *agent) interval() time.Duration {
	if a.applied != nil {
		return a.applied.ResyncInterval
	}
	return config.Default(a.opts.flags).ResyncInterval
}

// sync loads the config and puts it in the kernel. On a bad config the
// kernel keeps the rules it has.
func (a *agent) sync() error {
	cfg, warnings, err := a.loader.Load(a.opts.configPath, a.opts.flags)
	partial := config.IsPartial(err)
	if !slices.Equal(warnings, a.lastWarnings) {
		for _, w := range warnings {
			a.log.Warn(w)
		}
		a.lastWarnings = warnings
	}
	switch _, serr := os.Stat(a.opts.configPath); {
	case partial:
		// Some files of a config directory are bad: the merge of the
		// others with the bad ones' last good content is applied.
		a.metrics.ConfigLoaded("error")
		a.logError("config file not applied; its last good content stays in force with the other files", err)
	case err != nil:
		a.metrics.ConfigLoaded("error")
		a.logError("config not applied; the rules in the kernel are unchanged", err)
		return err
	case errors.Is(serr, fs.ErrNotExist):
		a.metrics.ConfigLoaded("missing")
	default:
		a.metrics.ConfigLoaded("success")
	}
	rs := nft.Build(cfg, a.opts.nft)
	start := time.Now()
	res, err := a.applier.Apply(rs)
	took := time.Since(start)
	if err := a.record(err, took); err != nil {
		return err
	}
	a.metrics.SetStaleAfter(3 * cfg.ResyncInterval)
	a.setElements(cfg, rs)
	if !partial {
		a.lastErr = ""
	}

	attrs := []any{"took", took.Round(time.Microsecond), "messages", res.Messages, "bytes", res.Bytes}
	for _, s := range rs.Sets {
		attrs = append(attrs, s.Name, len(s.Prefixes))
	}
	switch {
	case a.applied == nil:
		a.log.Info("applied config", append(attrs, "created", res.Created)...)
	case !a.applied.Equal(cfg):
		a.log.Info("applied new config", append(attrs, "changes", strings.Join(cfg.Diff(*a.applied), "; "))...)
	case res.Unchanged:
		a.log.Debug("resync: the kernel holds the rules already; nothing sent")
	default:
		a.log.Debug("resync: rewrote the table", attrs...)
	}
	if a.applied == nil || !a.applied.Equal(cfg) {
		a.log.Debug("ruleset", "nft", nft.Render(rs))
	}
	a.applied, a.ruleset = &cfg, &rs
	return nil
}

// apply puts a ruleset in the kernel, as a sync does.
func (a *agent) apply(rs nft.Ruleset) error {
	start := time.Now()
	_, err := a.applier.Apply(rs)
	return a.record(err, time.Since(start))
}

// record counts and logs a sync's result.
func (a *agent) record(err error, took time.Duration) error {
	if err != nil {
		err = hint(err)
		a.metrics.SyncDone("error", took)
		a.metrics.SyncFailed(err.Error())
		a.logError("sync failed; the kernel keeps its previous rules", err)
		return err
	}
	a.metrics.SyncDone("success", took)
	return nil
}

// setElements publishes, per set, the CIDRs the config lists and the
// intervals the kernel holds.
func (a *agent) setElements(cfg config.Config, rs nft.Ruleset) {
	count := func(ps []netip.Prefix, is6 bool) (n int) {
		for _, p := range ps {
			if p.Addr().Unmap().Is6() == is6 {
				n++
			}
		}
		return n
	}
	for _, s := range rs.Sets {
		family, is6 := "ipv4", s.Family == 6
		if is6 {
			family = "ipv6"
		}
		kind, cidrs := "masquerade", count(cfg.MasqueradeCIDRs, is6)
		if strings.HasPrefix(s.Name, "nonmasq") {
			kind, cidrs = "nonmasquerade", count(cfg.NonMasqueradeCIDRs, is6)
		}
		if is6 && !a.opts.flags.EnableIPv6 {
			cidrs = 0
		}
		a.metrics.SetElements(s.Name, family, kind, cidrs, len(s.Prefixes))
	}
}

// logError logs an error once until it changes or a sync succeeds.
func (a *agent) logError(msg string, err error) {
	if err.Error() == a.lastErr {
		a.log.Debug(msg, "err", err)
		return
	}
	a.lastErr = err.Error()
	a.log.Error(msg, "err", err)
}

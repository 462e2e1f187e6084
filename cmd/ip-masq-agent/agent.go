package main

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// agent is the daemon's state between syncs.
type agent struct {
	opts    options
	log     *slog.Logger
	applier *nft.Applier

	applied      *config.Config // the config last put in the kernel, nil before
	lastWarnings []string       // logged once, not every resync
	lastErr      string         // likewise
	failures     int            // consecutive failed syncs, for backoff
}

// loop syncs now and then every resync interval until ctx is done. A
// failed sync is retried sooner, with backoff, but never later than the
// resync interval.
func (a *agent) loop(ctx context.Context) {
	for {
		wait := a.interval()
		if err := a.sync(); err != nil {
			a.failures++
			wait = min(wait, time.Second<<min(a.failures-1, 6))
		} else {
			a.failures = 0
			wait = a.interval()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
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
	cfg, warnings, err := config.Load(a.opts.configPath, a.opts.flags)
	if !slices.Equal(warnings, a.lastWarnings) {
		for _, w := range warnings {
			a.log.Warn(w)
		}
		a.lastWarnings = warnings
	}
	if err != nil {
		a.logError("config not applied; the rules in the kernel are unchanged", err)
		return err
	}
	rs := nft.Build(cfg, a.opts.nft)
	start := time.Now()
	res, err := a.applier.Apply(rs)
	if err != nil {
		a.logError("sync failed", hint(err))
		return err
	}
	a.lastErr = ""
	attrs := []any{"duration", time.Since(start).Round(time.Microsecond), "messages", res.Messages, "bytes", res.Bytes}
	for _, s := range rs.Sets {
		attrs = append(attrs, s.Name, len(s.Prefixes))
	}
	changed := a.applied == nil || !a.applied.Equal(cfg)
	switch {
	case res.Created:
		a.log.Info("created table inet "+nft.TableName, attrs...)
	case changed:
		a.log.Info("applied new config", attrs...)
	default:
		a.log.Debug("resynced", attrs...)
	}
	if changed {
		a.log.Debug("ruleset", "nft", nft.Render(rs))
	}
	a.applied = &cfg
	return nil
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

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/conntrack"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/agent"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/filewatch"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/metrics"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft/kernel"
	"github.com/ip-masq-agent/ip-masq-agent-nft/original"
)

// probe asks the kernel whether it has what the table built with the
// options needs (a variable: tests give it a kernel that lacks something).
var probe = (*kernel.Netlink).ProbeFor

func hasSNAT(cfg config.Config) bool {
	return cfg.SNATAddress.IsValid() || cfg.SNATAddressIPv6.IsValid()
}

// kernelCannot logs the probe's answer err, when it is one: what the
// kernel lacks, or that the probe could not ask.
func kernelCannot(log *slog.Logger, err error) bool {
	var lacks *kernel.LacksError
	switch {
	case errors.As(err, &lacks):
		log.Error("this kernel cannot run ip-masq-agent", "err", err)
	case err != nil:
		log.Error("cannot ask the kernel what it can do", "err", agent.Hint(err))
	default:
		return false
	}
	return true
}

// asksFirst says whether the agent asks the probe before its first
// write: the daemon does, and --once that owns the table (it learns
// whether the kernel can); --once that writes it unowned asks only after
// a refused write, and --cleanup never.
func asksFirst(cleanup, once, noOwner bool) bool {
	return !cleanup && !(once && noOwner)
}

// onceRefused is the probe --once asks after its sync failed with err:
// only when the kernel refused a message of the write (nft.RefusedError),
// for the table built with o, and snat when the config cfg has an
// address. nil: not asked, or nothing found.
func onceRefused(err error, cfg config.Config, ask func(nft.Options) error, o nft.Options) error {
	var refused *nft.RefusedError
	if !errors.As(err, &refused) {
		return nil
	}
	o.SNAT = hasSNAT(cfg)
	return ask(o)
}

// runOnce is --once after the probe: one sync; when it fails, late (nil:
// none) may ask the probe what the kernel lacks, whose line follows the
// sync's; then the release of the table (--release-on-exit).
func runOnce(log *slog.Logger, sync func() error, late func(error) error, release func()) int {
	err := sync()
	if err != nil && late != nil {
		kernelCannot(log, late(err))
	}
	release()
	if err != nil {
		if errors.Is(err, nft.ErrOwnedByOther) {
			log.Error("not applied: --once does not wait for the owner; run it again after that process exits", "err", err)
		}
		return 1
	}
	return 0
}

// runDaemon runs the agent (the DaemonSet's command), --once and --cleanup
// among its modes, with its parsed flags.
func runDaemon(d daemonFlags, stderr io.Writer) int {
	o := d.options
	log, err := newLogger(stderr, d.logFormat, d.logLevel, int(d.logFlags.v))
	if err != nil {
		fmt.Fprintf(stderr, "ip-masq-agent: %v\n", err)
		return 2
	}

	// The version, the config source and the flags that differ from
	// their defaults: one short line.
	attrs := []any{"version", version, "config", config.KindOf(o.configPath).String() + " " + o.configPath}
	d.visit(func(f *flag.Flag) {
		if f.Name != "version" && f.Name != "config" && f.Value.String() != f.DefValue {
			attrs = append(attrs, f.Name, f.Value.String())
		}
	})
	log.Info("starting ip-masq-agent", attrs...)
	if d.logIgnored != "" {
		log.Warn(d.logIgnored)
	}
	if d.resyncWarning != "" {
		log.Warn(d.resyncWarning)
	}
	for _, w := range d.warnings {
		log.Warn(w)
	}

	slog.SetDefault(log)
	// --once that releases the table at its end (--release-on-exit, the
	// default) writes it unowned from the start: owning it for the length
	// of one transaction guards nothing that the transaction itself and
	// the generation after it (kernel.Netlink.Send) do not, and the
	// release re-created the whole table a second time. Without the
	// release, it owns the table as the daemon does.
	k := &kernel.Netlink{NoOwner: !o.ownTable || (o.once && o.release), Log: log}
	defer k.Close()
	m := metrics.New(version, func() ([]nft.RuleCounter, error) { return k.DecisionCounters(o.nft.Chain) })
	// The daemon also watches nftables notifications: a change by another
	// process (possible when the table is not owned) is verified and
	// repaired at once rather than at the next resync.
	loader := &config.Loader{}
	ao := agent.Options{ConfigPath: o.configPath, Flags: o.flags, NFT: o.nft, Watch: !o.once, Once: o.once, Original: original.Netlink{K: k}, Loader: loader}
	if o.conntrack != conntrack.ModeNone && o.nft.CtLabel == nil {
		log.Warn("conntrack cleanup without a mark (--conntrack-label=none): a change from masquerade to no masquerade also deletes the entries that another component (kube-proxy, a CNI) masqueraded to a node address", "mode", o.conntrack)
	}
	if o.conntrack != conntrack.ModeNone {
		ao.Applied = conntrackCleanup{mode: o.conntrack, log: log, m: m}.Applied
	}
	ag := agent.New(ao, k, log, m)
	// A kernel that lacks what the table needs (kernel.Netlink.Probe asks it,
	// in a transaction that never commits): one line naming what, and the
	// oldest kernel that has it, rather than failed syncs forever. The
	// probe also learns whether the kernel can own the table. It runs
	// while the config is read (the loader the agent's first sync reads
	// it again with, which then parses nothing): most of its time is the
	// kernel's wait for an RCU grace period after it aborts the probe's
	// transaction. Only a config with snat addresses asks again, for snat.
	//
	// --once that writes the table unowned (the default) asks nothing
	// first: it has no ownership to learn, and a kernel that lacks a part
	// of the table refuses the whole write, so that the table stays as it
	// was. It asks only when the kernel refuses its write (onceRefused).
	// The grace period was about a quarter of a cold --once's wall time
	// at 10,000 CIDRs.
	first := asksFirst(o.cleanup, o.once, k.NoOwner)
	if first {
		start := time.Now()
		probed := make(chan error, 1)
		go func() { probed <- probe(k, o.nft) }()
		cfg, _, cerr := loader.Load(o.configPath, o.flags)
		err := <-probed
		if err == nil && cerr == nil && hasSNAT(cfg) {
			o.nft.SNAT = true // the probe asks for snat
			err = probe(k, o.nft)
		}
		log.Debug("asked the kernel what it can do", "took", time.Since(start).Round(time.Microsecond), "own", k.Owns())
		if kernelCannot(log, err) {
			return 1
		}
	}
	switch {
	case o.cleanup:
		return cleanupTable(k, log)
	case o.once:
		var late func(error) error
		if !first {
			late = func(err error) error {
				cfg, _, _ := loader.Load(o.configPath, o.flags) // the sync's, parsed once
				return onceRefused(err, cfg, func(opts nft.Options) error { return probe(k, opts) }, o.nft)
			}
		}
		release := func() {}
		if o.release {
			release = func() { releaseTable(k, log) }
		}
		return runOnce(log, func() error { return ag.Sync(time.Now()) }, late, release)
	}
	// Without CAP_NET_ADMIN nothing will ever work: fail at start with one
	// line rather than retry forever. (EPERM alone does not tell: a table
	// owned by another process's socket is refused with EPERM too.)
	if !hasCapNetAdmin() {
		log.Error("cannot program nftables", "err", agent.Hint(syscall.EPERM))
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	served := make(chan error, 1)
	go func() { served <- metrics.Serve(ctx, o.httpAddr, m.Handler(), log) }()
	fileChanged := watchConfig(ctx, o.configPath, log)
	loopDone := make(chan struct{})
	go func() { ag.Run(ctx, fileChanged); close(loopDone) }()
	if err := <-served; err != nil {
		log.Error("cannot serve --http-address", "err", err)
		stop()
		<-loopDone
		if o.release {
			releaseTable(k, log)
		}
		return 1
	}
	<-ctx.Done()
	select {
	case <-loopDone:
	case <-time.After(stopTimeout):
		// A netlink request the kernel is slow to answer (a huge foreign
		// set, say) is not interrupted: exit without it.
		log.Warn("the loop did not stop in time (a netlink request is slow); exiting anyway", "waited", stopTimeout)
	}
	// The rules stay: masquerade must survive a restart or a rolling update.
	if o.release {
		select {
		case <-loopDone:
			releaseTable(k, log)
		default: // the loop still holds the socket's lock: exit without it
		}
	}
	log.Info("stopping; the rules stay in place")
	return 0
}

// releaseTable re-creates the table this process owns, unowned and not
// persistent, in one transaction (no moment without its rules): the kernel
// drops the owner flag when the socket closes but keeps persist, which nft
// 1.0.6 lists as a bare "flags " line that nft -f refuses, so a saved
// ruleset would not load after the agent exits. A table it does not own
// (a kernel before 6.9, --own-table=false, another owner) is left as it is.
func releaseTable(k *kernel.Netlink, log *slog.Logger) {
	switch released, err := k.Release(); {
	case errors.Is(err, syscall.EPERM):
		// Without CAP_NET_ADMIN the table cannot be read, nor can this
		// process have made it owned: nothing to release (the failed
		// sync has said why already).
		log.Debug("no table to release: cannot read it", "err", err)
	case err != nil:
		log.Error("cannot release the table at exit; it stays owned until this process exits, then orphaned (flags persist)", "err", agent.Hint(err))
	case released:
		log.Info("released table inet " + nft.TableName + ": it stays in place, unowned and not persistent")
	}
}

// stopTimeout bounds the wait for the loop after SIGTERM, well within the
// kubelet's default grace period of 30 s.
const stopTimeout = 10 * time.Second

// conntrackCleanup is the daemon's agent.Options.Applied with a
// --conntrack mode other than none.
type conntrackCleanup struct {
	mode conntrack.Mode
	log  *slog.Logger
	m    *metrics.Agent
}

// flowDecider is t's Decider for conntrack flows: by source and
// destination, and, when either table decides on it (egressInterfaces),
// the out interface, which an entry does not keep: outIf finds it by the
// node's route now. A flow whose route is not found ("") is undetermined
// and kept.
func flowDecider(t nft.Table, outIf func(src, dst netip.Addr) string) conntrack.Decider {
	d := t.Decider()
	return func(f conntrack.Flow) (bool, bool) {
		p := nft.Packet{Src: f.Src, Dst: f.Dst}
		if outIf != nil {
			p.OutIf = outIf(f.Src, f.Dst)
		}
		return d(p)
	}
}

// routes is routeOutIf remembered per flow for one cleanup.
func routes() func(src, dst netip.Addr) string {
	type key struct{ src, dst netip.Addr }
	seen := map[key]string{}
	r := newRouter()
	return func(src, dst netip.Addr) string {
		k := key{src, dst}
		if n, ok := seen[k]; ok {
			return n
		}
		n := r.outIf(src, dst)
		seen[k] = n
		return n
	}
}

// Applied deletes the conntrack entries whose decision the new table made
// wrong; the agent calls it after the new rules are in force.
//
// old is what the kernel held before (an empty table when there was none:
// nothing masqueraded). When old's masquerade rules marked the connections
// they masqueraded (--conntrack-label), only marked entries are undone;
// otherwise (no table before, an agent without the mark, a foreign rule
// in its masquerade chain, --conntrack-label=none) every entry
// masqueraded to a node address counts as the agent's, and the cleanup's
// log line says so (marked=false).
func (c conntrackCleanup) Applied(old, new nft.Table) {
	mark := old.MarkLabel()
	var outIf func(src, dst netip.Addr) string
	if matchesOutIf(old) || matchesOutIf(new) {
		outIf = routes()
	}
	res, err := conntrack.CleanupMarked(netns.None(), c.mode, flowDecider(old, outIf), flowDecider(new, outIf), mark)
	c.m.ConntrackDeleted(res.Deleted)
	attrs := []any{"mode", c.mode, "marked", mark >= 0}
	if mark >= 0 {
		attrs = append(attrs, "label", mark)
	}
	if err != nil {
		c.log.Error("conntrack cleanup failed; running flows keep their old decision", append(attrs, "err", err)...)
		return
	}
	if res.Deleted > 0 || res.Failed > 0 {
		c.log.Info("conntrack cleanup: "+res.String(), attrs...)
	} else {
		c.log.Debug("conntrack cleanup: "+res.String(), attrs...)
	}
	if res.Replies() > 0 {
		go c.replies(res)
	}
	// A change of snatAddress: the flows NATed to an address the new
	// rules no longer give them.
	if moved := snatMoved(old, new, linkAddrs); len(moved) > 0 {
		res, err := conntrack.CleanupNATedTo(netns.None(), c.mode, moved, mark)
		c.m.ConntrackDeleted(res.Deleted)
		attrs := append(attrs, "from", fmt.Sprint(moved))
		if err != nil {
			c.log.Error("conntrack cleanup after a change of snatAddress failed; running flows keep their old address", append(attrs, "err", err)...)
			return
		}
		c.log.Info("conntrack cleanup after a change of snatAddress: "+res.String(), attrs...)
	}
}

// replyPasses are the waits before each look for entries that a reply
// made the other way round after a cleanup (conntrack.CleanupReplies): a
// round trip or more each, and fewer than a UDP entry's 30 s timeout in
// all. The looks stop at the first that finds none.
var replyPasses = []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second}

// replies deletes the entries that replies in flight re-created the other
// way round after the cleanup res: their flow's next packets would match
// them as replies, unmasqueraded for as long as the flow goes on.
func (c conntrackCleanup) replies(res conntrack.Result) {
	for _, wait := range replyPasses {
		time.Sleep(wait)
		r, err := conntrack.CleanupReplies(netns.None(), res)
		c.m.ConntrackDeleted(r.Deleted)
		if err != nil {
			c.log.Error("conntrack cleanup of entries re-created by replies failed; those flows stay unmasqueraded until idle", "err", err)
			return
		}
		if r.Deleted == 0 && r.Failed == 0 {
			c.log.Debug("conntrack cleanup: no entry re-created by a reply", "flows", res.Replies())
			return
		}
		c.log.Info("conntrack cleanup: entries a reply re-created the other way round (the flow's next packet is masqueraded): "+r.String(), "flows", res.Replies())
	}
}

// snatMoved are the addresses the old table source-NATed a family's
// flows to and the new one no longer does: its snat address when that
// changed or went, and, for a new one where there was none, the other
// addresses of the interfaces that hold it (what masquerade gave there).
// Nothing without a table before.
func snatMoved(old, new nft.Table, addrsOf func(link string) []netip.Addr) []netip.Addr {
	var out []netip.Addr
	if old.Chain(nft.MasqChainName) == nil {
		return nil // no table before: no flow was the agent's
	}
	o, n := old.SNATs(), new.SNATs()
	for _, is4 := range []bool{true, false} {
		var oa, na netip.Addr
		var links []string
		for _, l := range o {
			if l.Addr.Is4() == is4 {
				oa = l.Addr
			}
		}
		for _, l := range n {
			if l.Addr.Is4() == is4 {
				na, links = l.Addr, append(links, l.Link)
			}
		}
		if oa == na {
			continue
		}
		if oa.IsValid() {
			out = append(out, oa)
		}
		for _, link := range links {
			if oa.IsValid() {
				break // the old snat address's flows only
			}
			for _, a := range addrsOf(link) {
				if a.Is4() == is4 && a != na && !slices.Contains(out, a) && !a.IsLinkLocalUnicast() {
					out = append(out, a)
				}
			}
		}
	}
	return out
}

// debounce coalesces a burst of file events (the kubelet's ..data swap is
// several) into one reload.
const debounce = 10 * time.Millisecond

// watchConfig returns a channel that receives after every change of the
// config file, or of the files of a config directory.
func watchConfig(ctx context.Context, path string, log *slog.Logger) <-chan struct{} {
	onError := func(err error) { log.Warn("watching the config file", "err", err) }
	var ch <-chan struct{}
	var err error
	switch config.KindOf(path) {
	case config.SourceNone:
		return nil
	case config.SourceDir:
		// A directory of files (a projected volume of ConfigMaps): config.Loader merges them.
		ch, err = filewatch.WatchDir(ctx, path, config.IsConfigName, debounce, onError)
	default:
		ch, err = filewatch.Watch(ctx, path, debounce, onError)
	}
	if err != nil {
		// The periodic resync still picks changes up.
		log.Error("cannot watch the config file; relying on the resync interval", "err", err)
	}
	return ch
}

// hasCapNetAdmin reports whether CAP_NET_ADMIN is in the effective set.
func hasCapNetAdmin() bool {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return true // cannot tell: let the kernel decide
	}
	for _, line := range strings.Split(string(status), "\n") {
		if hex, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			return err != nil || caps&(1<<unix.CAP_NET_ADMIN) != 0
		}
	}
	return true
}

func newLogger(w io.Writer, format, level string, verbosity int) (*slog.Logger, error) {
	lvl := slog.LevelInfo
	if verbosity >= 2 {
		lvl = slog.LevelDebug
	}
	if level != "" {
		if err := lvl.UnmarshalText([]byte(level)); err != nil {
			return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
		}
	}
	ho := &slog.HandlerOptions{Level: lvl}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, ho)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, ho)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

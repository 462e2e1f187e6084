package agent

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/metrics"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// ownedKernel is the CPU of kernel.Netlink on an owned table, without the
// socket: a read after our own commit is the table the plan made of the
// last one (read.go verifies only what changed, in the kernel), and a
// send runs the plan on it (netlink.go's ExecPlan).
type ownedKernel struct{ t *nft.Table }

func (k *ownedKernel) Read() (*nft.Table, uint32, error) { return k.t, 0, nil }
func (k *ownedKernel) Owns() bool                        { return true }
func (k *ownedKernel) Watch(ctx context.Context, _ func(nft.Event)) error {
	<-ctx.Done()
	return nil
}
func (k *ownedKernel) Send(p nft.Plan, _ uint32) (nft.Sent, error) {
	t, err := nft.ExecPlan(k.t, p)
	if err != nil {
		return nft.Sent{}, err
	}
	k.t = t
	return nft.Sent{Messages: len(p.Ops)}, nil
}

// benchConfig is the bench's config file (bench/control.go): n
// non-adjacent /29s; changed: the middle one replaced by the /29 after it.
func benchConfig(n int, changed bool) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "cidrLimit: %d\nnonMasqueradeCIDRs:\n", n)
	for i := range n {
		v := uint32(100<<24|64<<16) + uint32(i)*32
		if changed && i == n/2 {
			v += 8
		}
		fmt.Fprintf(&b, "  - \"%d.%d.%d.%d/29\"\n", byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	}
	return []byte(b.String())
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkChange100k is the daemon's path for a one-CIDR change of a
// config file of 100,000 CIDRs: the file read and parsed, the table
// built, compared, planned, sent and verified (the kernel's share aside),
// the conntrack cleanup's deciders made. cpu-ms/op is the process's CPU
// (rusage: user+sys, the garbage collector's too). Resync is a sync of
// the same file again.
func BenchmarkChange100k(b *testing.B) {
	files := [2][]byte{benchConfig(100_000, false), benchConfig(100_000, true)}
	setup := func(b *testing.B) (*Agent, string) {
		path := filepath.Join(b.TempDir(), "config")
		if err := os.WriteFile(path, files[0], 0o644); err != nil {
			b.Fatal(err)
		}
		o := Options{ConfigPath: path, NFT: nft.Options{Chain: nft.DefaultChain, RandomFully: true},
			Applied: func(old, new nft.Table) { old.Decider(); new.Decider() }}
		a := New(o, &ownedKernel{}, slog.New(slog.NewTextHandler(io.Discard, nil)), metrics.New("bench", nil))
		if err := a.Sync(time.Now()); err != nil {
			b.Fatal(err)
		}
		return a, path
	}
	b.Run("change", func(b *testing.B) {
		a, path := setup(b)
		var cpu time.Duration
		i := 0
		for b.Loop() {
			b.StopTimer()
			i++
			if err := os.WriteFile(path, files[i%2], 0o644); err != nil {
				b.Fatal(err)
			}
			c0 := cpuTime()
			b.StartTimer()
			if err := a.Sync(time.Now()); err != nil {
				b.Fatal(err)
			}
			cpu += cpuTime() - c0
		}
		b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/op")
	})
	b.Run("resync", func(b *testing.B) {
		a, _ := setup(b)
		c0 := cpuTime()
		for b.Loop() {
			if err := a.Sync(time.Now()); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64((cpuTime()-c0).Microseconds())/1000/float64(b.N), "cpu-ms/op")
	})
}

var _ = config.Default

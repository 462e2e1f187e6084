package test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft/kernel"
)

// TestKernelProbe: this kernel has what the agent needs (the probe says
// nothing is missing, every feature asked: a conntrack label, port
// ranges), and the probe changes nothing: no table, no new
// generation.
func TestKernelProbe(t *testing.T) {
	topo := newTopology(t)
	k := &kernel.Netlink{NetNS: int(topo.NodeHandle())}
	defer k.Close()
	// The kernel's generation (Read's is the table's, 0 when there is
	// none): any commit in the namespace moves it.
	generation := func() uint32 {
		var gen uint32
		if err := k.Session(func(s kernel.Session) (err error) { gen, err = s.Generation(); return err }); err != nil {
			t.Fatal(err)
		}
		return gen
	}
	before := generation()
	if err := k.Probe(); err != nil {
		t.Errorf("Probe: %v", err)
	}
	if after := generation(); after != before {
		t.Errorf("the probe moved the generation from %d to %d: a transaction committed", before, after)
	}
	if out, err := topo.NFT("list", "tables"); err != nil || strings.Contains(out, "probe") {
		t.Errorf("nft list tables after the probe: %v\n%s", err, out)
	}
}

// TestKernelProbeKeepsNotifications: a probe, on a Netlink whose table is
// not owned and whose watch runs, neither notifies (its transaction never
// commits) nor disturbs the watch: the first event after it is the next
// foreign change of the table, and a commit to another table in between
// is no event. (The start probe was once taken for the cause of a daemon
// that missed a foreign change; the change had landed within its first
// apply, which put it back itself: TestTamperedShapesRepaired.)
func TestKernelProbeKeepsNotifications(t *testing.T) {
	for _, noOwner := range []bool{true, false} {
		t.Run(map[bool]string{true: "probe without ownership", false: "probe with the owned table"}[noOwner], func(t *testing.T) {
			topo := newTopology(t)
			k := &kernel.Netlink{NetNS: int(topo.NodeHandle()), NoOwner: true}
			defer k.Close()
			want := nft.Build(config.Default(config.Flags{}), nft.Options{Chain: nft.DefaultChain, RandomFully: true})
			if _, err := nft.Ensure(k, want); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			events := make(chan nft.Event, 16)
			watched := make(chan error, 1)
			go func() { watched <- k.Watch(ctx, func(e nft.Event) { events <- e }) }()
			if e := <-events; e.What != "watch started" {
				t.Fatalf("first event %q", e.What)
			}
			prober := &kernel.Netlink{NetNS: int(topo.NodeHandle()), NoOwner: noOwner}
			defer prober.Close()
			for _, p := range []*kernel.Netlink{k, prober} {
				if err := p.Probe(); err != nil {
					t.Fatalf("Probe: %v", err)
				}
			}
			if out, err := topo.NFT("add", "table", "ip", "neighbour"); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if out, err := topo.NFT("add", "set", "inet", nft.TableName, "extra", "{ type ipv4_addr; }"); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			select {
			case e := <-events:
				if e.What != "add set" || e.Lost {
					t.Errorf("the first event after the probes: %+v, want the foreign add set", e)
				}
			case err := <-watched:
				t.Fatalf("the watch ended: %v", err)
			case <-time.After(20 * time.Second):
				t.Fatal("no event for the foreign change after the probes")
			}
			// A read after the probes finds the change: the read path's
			// state (fence, monitor) is the kernel's too.
			found, _, err := k.Read()
			if err != nil || found == nil || found.Set("extra") == nil {
				t.Errorf("read after the change: %v, set extra found: %v", err, found != nil && found.Set("extra") != nil)
			}
		})
	}
}

// TestKernelProbeIgnoresPlantedTables: tables another process made under
// the names a probe might use (an owned one, an unowned "-owned" one, and
// one for the sentinel to delete) neither fail the probe, nor turn the
// ownership off, nor let it commit: each probe's tables have a name of
// their own, and its sentinel a name no table can have.
func TestKernelProbeIgnoresPlantedTables(t *testing.T) {
	topo := newTopology(t)
	owns := kernelOwns(t, topo) // learnt before anything is planted
	planted := []string{nft.TableName + "-probe", nft.TableName + "-probe-owned", nft.TableName + "-probe-absent"}
	for _, name := range planted {
		if out, err := topo.NFT("add", "table", "inet", name); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	want, err := topo.NFT("list", "tables")
	if err != nil {
		t.Fatal(err)
	}
	k := &kernel.Netlink{NetNS: int(topo.NodeHandle())}
	defer k.Close()
	if err := k.Probe(); err != nil {
		t.Errorf("Probe with planted tables: %v", err)
	}
	if got := k.Owns(); got != owns {
		t.Errorf("after the probe Owns() = %v; the kernel says %v", got, owns)
	}
	if got, err := topo.NFT("list", "tables"); err != nil || got != want {
		t.Errorf("the probe changed the tables: %v\nbefore:\n%s\nafter:\n%s", err, want, got)
	}
}

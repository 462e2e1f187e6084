package test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft/kernel"
)

func build(t *testing.T, yaml string) nft.Table {
	t.Helper()
	cfg, _, err := config.Parse([]byte(yaml), config.Flags{})
	if err != nil {
		t.Fatal(err)
	}
	return nft.Build(cfg, nft.Options{Chain: nft.DefaultChain, RandomFully: true})
}

// manyCIDRs is a nonMasqueradeCIDRs list of n CIDRs that stay n set
// elements: /25s with a gap between any two (adjacent ones would merge).
func manyCIDRs(n int, extra ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "cidrLimit: %d\nnonMasqueradeCIDRs:\n", n+len(extra))
	for i := 0; i < n; i++ {
		if i < 192*256 {
			fmt.Fprintf(&b, "- 100.%d.%d.0/25\n", 64+i/256, i%256)
		} else { // set elements only: no traffic goes there
			j := i - 192*256
			fmt.Fprintf(&b, "- 101.%d.%d.0/25\n", j/256, j%256)
		}
	}
	for _, e := range extra {
		fmt.Fprintf(&b, "- %s\n", e)
	}
	return b.String()
}

func mustApplyRS(t *testing.T, a *kernel.Netlink, rs nft.Table) nft.Result {
	t.Helper()
	res, err := nft.Ensure(a, rs)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestNoChurn: an unchanged resync sends nothing (counters keep counting);
// a changed config sends only the differences; a change by another process
// is noticed through the nftables generation id and undone.
func TestNoChurn(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, internet1, internet2, private1)
	a := &kernel.Netlink{NetNS: int(topo.NodeHandle()), NoOwner: true}
	rs := build(t, manyCIDRs(10_000, "10.0.0.0/8"))
	if res := mustApplyRS(t, a, rs); !res.Created {
		t.Errorf("first apply: %+v, want the table created", res)
	}
	expectSources(t, topo, map[string]bool{internet1: true, private1: false})
	counted := listTable(t, topo)

	if res := mustApplyRS(t, a, rs); !res.Unchanged || res.Messages != 0 {
		t.Errorf("unchanged resync: %+v, want nothing sent", res)
	}
	if got := listTable(t, topo); got != counted {
		t.Errorf("an unchanged resync changed the table (counters reset?):\nbefore:\n%s\nafter:\n%s", counted, got)
	}

	// One CIDR changed out of 10,001: one removal, one addition; the
	// rules, untouched, keep their counters.
	rs2 := build(t, strings.Replace(manyCIDRs(10_000, "10.0.0.0/8"), "- 100.64.0.0/25\n", "- 203.0.113.0/24\n", 1))
	res := mustApplyRS(t, a, rs2)
	if !res.Partial || res.Messages != 2 {
		t.Errorf("one CIDR changed: %+v, want a partial apply of 2 messages", res)
	}
	if got := withoutSets(listTable(t, topo)); got != withoutSets(counted) {
		t.Errorf("a set change touched the rules:\nbefore:\n%s\nafter:\n%s", withoutSets(counted), got)
	}
	expectSources(t, topo, map[string]bool{internet1: false, internet2: true, private1: false})
	if out, _ := topo.NFT("get", "element", "inet", "ip-masq-agent", "nonmasq-v4", "{ 100.64.0.1 }"); strings.Contains(out, "100.64.0.0/25") {
		t.Errorf("the removed CIDR 100.64.0.0/25 is still in the set: %s", out)
	}

	// Another process adds an element: the next resync reads the table
	// back and removes just that element.
	if out, err := topo.NFT("add", "element", "inet", "ip-masq-agent", "nonmasq-v4", "{ 198.51.100.0/24 }"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	expectSources(t, topo, map[string]bool{internet2: false})
	if res := mustApplyRS(t, a, rs2); !res.Partial || res.Plan.String() != "delete element inet ip-masq-agent nonmasq-v4 { 198.51.100.0/24 }\n" {
		t.Errorf("resync after a foreign change: %+v, want the foreign element deleted", res)
	}
	expectSources(t, topo, map[string]bool{internet2: true})
}

// withoutSets keeps the chains of an nft listing (the lines after the
// first chain).
func withoutSets(s string) string {
	if i := strings.Index(s, "\tchain "); i >= 0 {
		return s[i:]
	}
	return s
}

// TestWatchRepairs runs Watch with a repairing callback, as the daemon
// does, and has another process (the nft CLI) delete the table, flush the
// chain, add an element and add a rule: each is undone. The notifications
// say nothing about who changed the table: every one brings a read-back,
// and the agent's own transactions, which the watch does not receive,
// bring no write.
func TestWatchRepairs(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, internet1, private1)
	a := &kernel.Netlink{NetNS: int(topo.NodeHandle()), NoOwner: true}
	rs := build(t, "")
	mustApplyRS(t, a, rs)
	want := withoutCounters(listTable(t, topo))

	var mu sync.Mutex
	var events []nft.Event
	var writes int
	subscribed := make(chan struct{})
	repaired := make(chan struct{}, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- a.Watch(ctx, func(e nft.Event) {
			mu.Lock()
			events = append(events, e)
			mu.Unlock()
			if e.What == "watch started" {
				close(subscribed)
				return
			}
			res, err := nft.Ensure(a, rs)
			if err != nil {
				t.Errorf("repair: %v", err)
			}
			if !res.Unchanged {
				mu.Lock()
				writes++
				mu.Unlock()
			}
			repaired <- struct{}{}
		})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Watch: %v", err)
		}
	}()
	<-subscribed
	// The agent's own changes: no notification reaches its watch.
	mustApplyRS(t, a, build(t, "nonMasqueradeCIDRs: [10.0.0.0/8]\n"))
	mustApplyRS(t, a, rs)
	if out, err := topo.NFT("add", "table", "ip", "unrelated"); err != nil {
		t.Fatalf("%v %s", err, out)
	}

	for _, tamper := range [][]string{
		{"delete", "table", "inet", "ip-masq-agent"},
		{"flush", "chain", "inet", "ip-masq-agent", "IP-MASQ-AGENT"},
		{"add", "element", "inet", "ip-masq-agent", "nonmasq-v4", "{ 203.0.113.0/24 }"},
		{"add", "rule", "inet", "ip-masq-agent", "IP-MASQ-AGENT", "ip daddr 203.0.113.10 return"},
		{"flush", "ruleset"},
	} {
		if out, err := topo.NFT(tamper...); err != nil {
			t.Fatalf("nft %v: %v %s", tamper, err, out)
		}
		select {
		case <-repaired:
		case <-time.After(10 * time.Second):
			t.Fatalf("nft %s was not repaired within 10s", strings.Join(tamper, " "))
		}
		if got := withoutCounters(listTable(t, topo)); got != want {
			t.Errorf("after nft %s and the repair, the table is:\n%s\nwant:\n%s", strings.Join(tamper, " "), got, want)
		}
		expectSources(t, topo, map[string]bool{internet1: true, private1: false})
	}
	mu.Lock()
	defer mu.Unlock()
	if len(events) != 6 || writes != 5 {
		t.Errorf("%d events and %d writes, want 6 (the start and one per foreign transaction) and 5: %+v", len(events), writes, events)
	}
	t.Logf("events seen: %+v", events)
}

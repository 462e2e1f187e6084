package kernel

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// TestProbeAsksWhatTheTableUses: for the options the agent runs with, the
// probe asks for every expression the table built with them uses, each
// with the same attributes (a masquerade's port registers, a ct set's
// source register), and for no feature that the options leave out: a
// kernel without numgen runs an agent without --to-ports ranges.
func TestProbeAsksWhatTheTableUses(t *testing.T) {
	bit := uint8(3)
	ports := []nft.PortRange{{First: 2000, Last: 2999}, {First: 5000, Last: 5999}}
	for name, c := range map[string]struct {
		o    nft.Options
		not  []string // features the probe must not ask for
		want []string // features it must
	}{
		"no label, no ports": {nft.Options{RandomFully: true},
			[]string{"nft_ct", "nft_numgen", "masquerade to a port range", "nft_nat"}, nil},
		"the default label": {nft.Options{RandomFully: true, CtLabel: &bit},
			[]string{"nft_numgen", "masquerade to a port range"}, []string{"nft_ct"}},
		"one port range": {nft.Options{RandomFully: true, CtLabel: &bit, ToPorts: ports[:1]},
			[]string{"nft_numgen"}, []string{"nft_ct", "masquerade to a port range"}},
		"two port ranges": {nft.Options{RandomFully: true, CtLabel: &bit, ToPorts: ports, EnableIPv6: true},
			nil, []string{"nft_ct", "masquerade to a port range", "nft_numgen"}},
		"snat": {nft.Options{RandomFully: true, CtLabel: &bit, SNAT: true},
			[]string{"nft_numgen"}, []string{"nft_ct", "nft_nat"}},
		"everything (Probe)": {probeEverything, nil, []string{"nft_ct", "masquerade to a port range", "nft_numgen", "nft_nat"}},
	} {
		t.Run(name, func(t *testing.T) {
			c.o.Chain = nft.DefaultChain
			b, err := probeBatch(probeTable+"test", false, c.o)
			if err != nil {
				t.Fatal(err)
			}
			asked := map[string]bool{}
			for _, i := range b.op {
				if i >= 0 {
					asked[features[i].what] = true
					asked[features[i].module] = true
				}
			}
			for _, f := range c.not {
				if asked[f] {
					t.Errorf("the probe asks for %s", f)
				}
			}
			for _, f := range c.want {
				if !asked[f] {
					t.Errorf("the probe does not ask for %s", f)
				}
			}
			probed := exprKinds(t, b.msgs)
			// Every key in use: the source lists' inverted lookup among them.
			cfg := config.Default(config.Flags{EnableIPv6: c.o.EnableIPv6})
			cfg.NonMasqueradeSourceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}
			cfg.MasqueradeSourceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}
			cfg.EgressInterfaces = []string{"eth0", "ens*"}
			table := nft.Build(cfg, c.o)
			var rules []netlink.Message
			cc, _ := nftables.New(nftables.WithTestDial(captureDial(&rules)))
			tb := &nftables.Table{Family: nftables.TableFamilyINet, Name: nft.TableName}
			for _, ch := range table.Chains {
				for _, r := range ch.Rules {
					cc.AddRule(&nftables.Rule{Table: tb, Chain: &nftables.Chain{Name: ch.Name}, Exprs: r.Encode()})
				}
			}
			if err := cc.Flush(); err != nil {
				t.Fatal(err)
			}
			used := exprKinds(t, rules)
			if len(used) == 0 {
				t.Fatal("the table has no expressions")
			}
			for k := range used {
				if !probed[k] {
					t.Errorf("the table uses %s, which the probe does not ask for (it asks for %v)", k, slices.Sorted(maps.Keys(probed)))
				}
			}
		})
	}
}

// captureDial is a test dial of google/nftables that keeps the messages
// of each batch (without its begin and end).
func captureDial(into *[]netlink.Message) func([]netlink.Message) ([]netlink.Message, error) {
	ack := []netlink.Message{{Header: netlink.Header{Type: netlink.Error}, Data: make([]byte, 4)}}
	return func(req []netlink.Message) ([]netlink.Message, error) {
		if req == nil {
			return ack, nil
		}
		*into = append(*into, req[1:len(req)-1]...)
		return nil, nil
	}
}

// exprKinds returns the expressions of the rule messages in msgs, each as
// its kernel name and the types of its attributes ("masq 1,2,3").
func exprKinds(t *testing.T, msgs []netlink.Message) map[string]bool {
	t.Helper()
	kinds := map[string]bool{}
	for _, m := range msgs {
		if m.Header.Type&0xff != unix.NFT_MSG_NEWRULE {
			continue
		}
		attrs, err := netlink.UnmarshalAttributes(m.Data[4:])
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range attrs {
			if a.Type&^unix.NLA_F_NESTED != unix.NFTA_RULE_EXPRESSIONS {
				continue
			}
			elems, err := netlink.UnmarshalAttributes(a.Data)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range elems {
				ex, err := netlink.UnmarshalAttributes(e.Data)
				if err != nil {
					t.Fatal(err)
				}
				var name string
				var types []int
				for _, x := range ex {
					switch x.Type &^ unix.NLA_F_NESTED {
					case unix.NFTA_EXPR_NAME:
						name = strings.TrimRight(string(x.Data), "\x00")
					case unix.NFTA_EXPR_DATA:
						data, err := netlink.UnmarshalAttributes(x.Data)
						if err != nil {
							t.Fatal(err)
						}
						for _, d := range data {
							types = append(types, int(d.Type&^unix.NLA_F_NESTED))
						}
					}
				}
				slices.Sort(types)
				kinds[fmt.Sprintf("%s %v", name, types)] = true
			}
		}
	}
	return kinds
}

// TestProbeAnswers: the first refused message of the probe names the
// feature it asks for and the oldest kernel with it; the sentinel's
// refusal alone, or a transaction refused whole, is no finding.
func TestProbeAnswers(t *testing.T) {
	b, err := probeBatch(probeTable+"test", true, probeEverything)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(b.op); n != len(b.msgs) || b.op[n-1] != probeSentinel || b.op[n-2] != probeOwned {
		t.Fatalf("%d messages, features %v: want the owned table, then the sentinel last", len(b.msgs), b.op)
	}
	if err := lacks(b.op, len(b.op)-2, syscall.EINVAL); err != nil {
		t.Errorf("the owned table refused: %v, want nil (not essential)", err)
	}
	if nb, _ := probeBatch(probeTable+"test", false, probeEverything); len(nb.op) != len(b.op)-1 || nb.op[len(nb.op)-2] == probeOwned {
		t.Errorf("without ownership the probe asks for it: %v", nb.op)
	}
	first := map[int]int{} // feature: its first message
	for i, f := range b.op {
		if _, ok := first[f]; !ok {
			first[f] = i
		}
	}
	for i, f := range features {
		m, ok := first[i]
		if !ok {
			t.Errorf("feature %q has no message", f.what)
			continue
		}
		err := lacks(b.op, m, syscall.EOPNOTSUPP)
		if err == nil || !strings.Contains(err.Error(), f.what+" (Linux "+f.since+" or later; module "+f.module+")") ||
			!strings.HasSuffix(err.Error(), "operation not supported") {
			t.Errorf("message %d refused: %v", m, err)
		}
	}
	if err := lacks(b.op, len(b.op)-1, syscall.ENOENT); err != nil {
		t.Errorf("the sentinel refused: %v, want nil", err)
	}
	if err := lacks(b.op, -1, syscall.EPERM); err != nil {
		t.Errorf("the transaction refused whole: %v, want nil", err)
	}
	nat := lacks(b.op, first[2], syscall.EOPNOTSUPP)
	if nat == nil || nat.Error() != "the kernel lacks nat chains in the inet family (Linux 5.2 or later; module nft_chain_nat): operation not supported" {
		t.Errorf("nat chain refused: %v", nat)
	}
}

// TestProbeNamesTheKernelsRefusal: a part of the probe that the kernel
// refuses (here a chain of a type that no kernel has, asked right after
// the nat chain) is named from the kernel's answer, and nothing is left
// behind: no table, no generation.
func TestProbeNamesTheKernelsRefusal(t *testing.T) {
	n, topo := kernelNetlink(t)
	defer func(f []feature) { features = f }(features)
	missing := feature{what: "chains of a type that no kernel has", since: "never", module: "none",
		add: func(cc *nftables.Conn, t *nftables.Table, _ nft.Options) {
			cc.AddChain(&nftables.Chain{Table: t, Name: "x", Type: "no-such-type",
				Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
		}}
	features = append(append(slices.Clone(features[:3]), missing), features[3:]...)
	before, err := generation(mustReader(t, n))
	if err != nil {
		t.Fatal(err)
	}
	err = n.Probe()
	var lacks *LacksError
	if !errors.As(err, &lacks) || lacks.What != missing.what ||
		!strings.HasPrefix(err.Error(), "the kernel lacks chains of a type that no kernel has (Linux never or later; module none): ") {
		t.Fatalf("Probe: %v, want the refused chain type named", err)
	}
	t.Logf("the kernel's answer: %v", err)
	if after, err := generation(mustReader(t, n)); err != nil || after != before {
		t.Errorf("generation %d -> %d (%v): the probe committed", before, after, err)
	}
	if out, err := topo.NFT("list", "tables"); err != nil || strings.Contains(out, "probe") {
		t.Errorf("nft list tables after the probe: %v\n%s", err, out)
	}
}

func mustReader(t *testing.T, n *Netlink) *netlink.Conn {
	t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	c, err := n.reader()
	if err != nil {
		t.Fatal(err)
	}
	return c.(*netlink.Conn)
}

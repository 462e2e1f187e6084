package test

import (
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft/kernel"
)

// setElements is the elements nft lists for one of the agent's sets, as
// nft writes them (a prefix, an address, or first-last).
func setElements(t *testing.T, listed, set string) []string {
	t.Helper()
	m := regexp.MustCompile(`(?s)set ` + regexp.QuoteMeta(set) + ` \{[^}]*?elements = \{([^}]*)\}`).FindStringSubmatch(listed)
	if m == nil {
		return nil
	}
	var out []string
	for _, e := range strings.Split(m[1], ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// TestAdjacentSetsKernel: adjacent CIDRs reach the kernel as one element
// each where its interval-set lookup is the tree's (nft/prefix.go's paint
// says why), joined into one where it is the array's (lookupKind, from
// the kernel's answer), as `nft list` shows them; the agent reads them
// back as the table it wants, and packets are decided as for the CIDRs as
// listed. A one-CIDR change between two adjacent ones sends that element
// alone on the tree's.
func TestAdjacentSetsKernel(t *testing.T) {
	topo := newTopology(t)
	inside := []string{"10.250.0.10", "10.250.1.10", "10.250.2.10", "10.250.3.10", "10.250.5.10", "10.250.7.10"}
	addDestinations(t, topo, append(inside, "10.250.4.10", "10.250.6.10", internet1)...)
	cfg := "nonMasqueradeCIDRs: [10.250.0.0/24, 10.250.1.0/24, 10.250.2.0/23, 10.250.5.0/24, 10.250.7.0/24]\n"
	mustApply(t, topo, cfg)
	array := lookupKind(t, topo.NodeHandle(), nft.TableName, nft.SetNonMasqV4, netip.MustParseAddr("169.254.0.0"), netip.MustParseAddr("169.255.0.0")) == lookupArray
	listed := listTable(t, topo)
	want1 := []string{"10.250.0.0/24", "10.250.1.0/24", "10.250.2.0/23", "10.250.5.0/24", "10.250.7.0/24", "169.254.0.0/16"}
	if array {
		want1 = []string{"10.250.0.0/22", "10.250.5.0/24", "10.250.7.0/24", "169.254.0.0/16"}
	}
	if got := setElements(t, listed, nft.SetNonMasqV4); !slices.Equal(got, want1) {
		t.Errorf("nft lists %s: %q, want %q (array lookup: %v)\n%s", nft.SetNonMasqV4, got, want1, array, listed)
	}
	// A restart asks the kernel first, so builds the table as it is: no change.
	if out, err := runAgent(t, topo, "--once", "--config", writeConfig(t, cfg)); err != nil || !strings.Contains(out, "without changing its contents") {
		t.Errorf("a second --once changed the table: %v\n%s", err, out)
	}
	want := map[string]bool{"10.250.4.10": true, "10.250.6.10": true, internet1: true}
	for _, a := range inside {
		want[a] = false
	}
	expectSources(t, topo, want)

	// 10.250.6.0/24 between 10.250.5.0/24 and 10.250.7.0/24: on the
	// tree's lookup one element added, its neighbours untouched.
	k := &kernel.Netlink{NetNS: int(topo.NodeHandle()), NoOwner: true}
	defer k.Close()
	cfg = "nonMasqueradeCIDRs: [10.250.0.0/24, 10.250.1.0/24, 10.250.2.0/23, 10.250.5.0/24, 10.250.7.0/24, 10.250.6.0/24]\n"
	c, _, err := config.Parse([]byte(cfg), config.Flags{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := nft.Ensure(k, nft.Build(c, nft.Options{Chain: nft.DefaultChain, RandomFully: true, MergeAdjacent: array}))
	if err != nil {
		t.Fatal(err)
	}
	var elems []nft.Op
	for _, op := range res.Plan.Ops {
		if op.Kind == nft.KindElements {
			elems = append(elems, op)
		}
	}
	if !array && (len(elems) != 1 || elems[0].Verb != nft.Add || len(elems[0].Elements) != 1) {
		t.Errorf("plan %q, want one element added", res.Plan)
	}
	listed = listTable(t, topo)
	want2 := []string{"10.250.0.0/24", "10.250.1.0/24", "10.250.2.0/23", "10.250.5.0/24", "10.250.6.0/24", "10.250.7.0/24", "169.254.0.0/16"}
	if array {
		want2 = []string{"10.250.0.0/22", "10.250.5.0-10.250.7.255", "169.254.0.0/16"}
	}
	if got := setElements(t, listed, nft.SetNonMasqV4); !slices.Equal(got, want2) {
		t.Errorf("after adding 10.250.6.0/24, nft lists %s: %q, want %q\n%s", nft.SetNonMasqV4, got, want2, listed)
	}
	want["10.250.6.10"] = false
	expectSources(t, topo, want)

	// The agent's reader sees what nft sees.
	found, err := k.ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range found.Set(nft.SetNonMasqV4).Elements {
		if p, ok := r.Prefix(); ok {
			names = append(names, p.String())
		} else {
			names = append(names, r.String())
		}
	}
	if got := strings.Join(names, ","); got != strings.Join(want2, ",") {
		t.Errorf("the agent reads %s as %s, want %s", nft.SetNonMasqV4, got, want2)
	}
	out, err := runAgent(t, topo, "explain", "--config", writeConfig(t, cfg), "10.250.6.10")
	if err != nil || !strings.Contains(out, "nonMasqueradeCIDRs[5] 10.250.6.0/24") || strings.Contains(out, "set element") {
		t.Errorf("explain 10.250.6.10: %v\n%s", err, out)
	}
	if array {
		// diff builds the sets as the agent does on this kernel: no
		// element differs (the chain differs: Ensure above built without
		// the agent's conntrack label).
		if out, _ := runAgent(t, topo, "diff", "--config", writeConfig(t, cfg)); strings.Contains(out, "element") {
			t.Errorf("diff of the joined table:\n%s", out)
		}
	}
}

// TestMostSpecificPackets: cidrMatch: mostSpecific, the three
// levels (10/8 not masqueraded, 10.20/16 masqueraded, 10.20.30/24 not)
// and a masqueraded host inside link-local, with packets; the chain is
// the listOrder chain, one lookup per set.
func TestMostSpecificPackets(t *testing.T) {
	topo := newTopology(t)
	const (
		in8  = "10.250.0.10" // 10/8 only
		in16 = "10.20.1.10"  // 10.20/16
		in24 = "10.20.30.10" // 10.20.30/24
		ll   = "169.254.169.10"
	)
	addDestinations(t, topo, in8, in16, in24, ll, linkLocal, internet1)
	cfg := "cidrMatch: mostSpecific\nnonMasqueradeCIDRs: [10.0.0.0/8, 10.20.30.0/24]\nmasqueradeCIDRs: [10.20.0.0/16, 169.254.169.10/32]\n"
	mustApply(t, topo, cfg)
	expectSources(t, topo, map[string]bool{in8: false, in16: true, in24: false, ll: true, linkLocal: false, internet1: true})
	listed := listTable(t, topo)
	if got, want := setElements(t, listed, nft.SetMasqV4), []string{"10.20.0.0-10.20.29.255", "10.20.31.0-10.20.255.255", "169.254.169.10"}; !slices.Equal(got, want) {
		t.Errorf("nft lists %s: %q, want %q\n%s", nft.SetMasqV4, got, want, listed)
	}
	if n := strings.Count(listed, "daddr @"); n != 2 {
		t.Errorf("%d set lookups in the table, want 2 (one per set)\n%s", n, listed)
	}
	for dst, want := range map[string]string{
		in16: "masqueradeCIDRs[0] 10.20.0.0/16",
		in24: "nonMasqueradeCIDRs[1] 10.20.30.0/24",
		in8:  "nonMasqueradeCIDRs[0] 10.0.0.0/8",
	} {
		out, err := runAgent(t, topo, "explain", "--config", writeConfig(t, cfg), dst)
		if err != nil || !strings.Contains(out, want) {
			t.Errorf("explain %s: %v, want %q in\n%s", dst, err, want, out)
		}
	}
	// IPv6, the same three levels.
	const (
		v6in8  = "fd00:99::10"
		v6in32 = "fd00:250:1::10"
		v6in64 = "fd00:250::10"
	)
	addDestinations(t, topo, v6in8, v6in32, v6in64, internet6a)
	mustApply(t, topo, "cidrMatch: mostSpecific\nnonMasqueradeCIDRs: [\"fd00::/8\", \"fd00:250::/64\"]\nmasqueradeCIDRs: [\"fd00:250::/32\"]\n", "--enable-ipv6")
	expectSources(t, topo, map[string]bool{v6in8: false, v6in32: true, v6in64: false, internet6a: true})

	// Back to listOrder: masqueradeCIDRs 10.20/16 wins over all of it.
	mustApply(t, topo, strings.TrimPrefix(cfg, "cidrMatch: mostSpecific\n"))
	expectSources(t, topo, map[string]bool{in8: false, in16: true, in24: true})
}

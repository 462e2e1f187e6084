package config

import (
	"strings"
	"testing"
)

// cidrMatch takes listOrder or mostSpecific, spelled exactly; under
// mostSpecific a CIDR in both lists is refused, naming both.
func TestCIDRMatch(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		want CIDRMatch
		err  string
	}{
		{yaml: "", want: ListOrder},
		{yaml: "cidrMatch: listOrder\n", want: ListOrder},
		{yaml: "cidrMatch: mostSpecific\n", want: MostSpecific},
		{yaml: "cidrMatch: mostspecific\n", err: `cidrMatch: "mostspecific" is not a cidrMatch: write "listOrder" (the default) or "mostSpecific"`},
		{yaml: "cidrMatch: 3\n", err: `cidrMatch: expected "listOrder" or "mostSpecific", got number 3`},
		{yaml: "cidrMatch: mostSpecific\nnonMasqueradeCIDRs: [10.0.0.0/8, 10.20.0.0/16]\nmasqueradeCIDRs: [192.0.2.0/24, 10.20.0.0/16]\n",
			err: `masqueradeCIDRs[1]: "10.20.0.0/16" is also nonMasqueradeCIDRs[1]: under cidrMatch: mostSpecific neither is more specific; remove one of them`},
		{yaml: "cidrMatch: mostSpecific\nmasqueradeCIDRs: [10.0.0.0/8]\n",
			err: `masqueradeCIDRs[0]: "10.0.0.0/8" is also nonMasqueradeCIDRs[0] (the default list): under cidrMatch: mostSpecific`},
		// listOrder: masqueradeCIDRs wins, as before.
		{yaml: "nonMasqueradeCIDRs: [10.20.0.0/16]\nmasqueradeCIDRs: [10.20.0.0/16]\n", want: ListOrder},
	} {
		c, _, err := Parse([]byte(tc.yaml), Flags{})
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: error %v, want %q", tc.yaml, err, tc.err)
		case tc.err == "" && (err != nil || c.CIDRMatch != tc.want):
			t.Errorf("%q: %v, %v; want %v", tc.yaml, c.CIDRMatch, err, tc.want)
		}
	}
	// At its default, String leaves it out: an old config keeps its Hash.
	def := Default(Flags{})
	if strings.Contains(def.String(), KeyCIDRMatch) {
		t.Errorf("String writes the default cidrMatch:\n%s", def)
	}
}

// --strict under mostSpecific: an entry inside a wider one of the other
// list has an effect; inside one of its own list with nothing between,
// none.
func TestShadowedMostSpecific(t *testing.T) {
	c, _, err := Parse([]byte("cidrMatch: mostSpecific\nnonMasqueradeCIDRs: [10.0.0.0/8, 10.20.30.0/24, 10.1.0.0/16]\nmasqueradeCIDRs: [10.20.0.0/16]\n"), Flags{})
	if err != nil {
		t.Fatal(err)
	}
	got := shadowed(c, map[string]bool{KeyNonMasq: true, KeyMasq: true})
	if len(got) != 1 || got[0].list != KeyNonMasq || got[0].index != 2 {
		t.Errorf("shadowed = %+v, want only nonMasqueradeCIDRs[2] 10.1.0.0/16", got)
	}
}

package config

import (
	"slices"
	"testing"
)

func TestDiff(t *testing.T) {
	old := Default(Flags{})
	c, _, err := Parse([]byte("nonMasqueradeCIDRs: [10.0.0.0/8, 100.64.0.0/10]\nmasqOutBound: false\nresyncInterval: 5s\n"), Flags{})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"nonMasqueradeCIDRs +100.64.0.0/10 -172.16.0.0/12 -192.168.0.0/16",
		"masqOutBound true->false",
		"resyncInterval 1m0s->5s",
	}
	if got := c.Diff(old); !slices.Equal(got, want) {
		t.Errorf("Diff = %q, want %q", got, want)
	}
	// This agent's own keys, a list of names among them.
	n, _, err := Parse([]byte("egressInterfaces: [eth0, \"ens*\"]\nmasqueradeSourceCIDRs: [10.244.0.0/16]\n"), Flags{})
	if err != nil {
		t.Fatal(err)
	}
	m, _, err := Parse([]byte("egressInterfaces: [eth0, wg0]\n"), Flags{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := m.Diff(n), []string{"masqueradeSourceCIDRs -10.244.0.0/16", "egressInterfaces +wg0 -ens*"}; !slices.Equal(got, want) {
		t.Errorf("Diff = %q, want %q", got, want)
	}
	if got := c.Diff(c); len(got) != 0 {
		t.Errorf("Diff of a config with itself = %q, want nothing", got)
	}
}

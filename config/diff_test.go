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
	if got := c.Diff(c); len(got) != 0 {
		t.Errorf("Diff of a config with itself = %q, want nothing", got)
	}
}

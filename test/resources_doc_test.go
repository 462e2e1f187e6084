package test

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// cpuFigures are the measured CPU bursts a text quotes: the seconds of CPU
// of a first apply of 100,000 CIDRs, of a conntrack cleanup of 250,000
// entries, and the wall time each takes under a 100m limit.
func cpuFigures(text string) []string {
	text = strings.Join(strings.Fields(text), " ")
	var out []string
	for _, re := range []string{
		`100,000 CIDRs[^0-9]*?(?:about|~) ?([0-9.]+) s of CPU`,
		`250,000 entries[^0-9]*?([0-9.]+) s`,
		`stretch(?:es)? (?:them )?to (?:about|~) ?([0-9.]+) s and ([0-9.]+) s`,
	} {
		m := regexp.MustCompile(re).FindStringSubmatch(text)
		if m == nil {
			return nil
		}
		out = append(out, m[1:]...)
	}
	return out
}

// TestManifestsCPUFiguresAgree: deploy/daemonset.yaml's comment on the CPU
// limit and docs/operation.md ("Resources and rollout") quote the same
// measured figures (they once said 0.5 s, 0.4 s and 5 s against 0.9 s,
// 0.52 s, 9 s and 5 s).
func TestManifestsCPUFiguresAgree(t *testing.T) {
	ds, err := os.ReadFile("../deploy/daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var comments []string
	for _, l := range strings.Split(string(ds), "\n") {
		if _, c, ok := strings.Cut(l, "#"); ok {
			comments = append(comments, c)
		}
	}
	op, err := os.ReadFile("../docs/operation.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(op), "\n## Resources and rollout\n")
	if !ok {
		t.Fatal("docs/operation.md has no section Resources and rollout")
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	a, b := cpuFigures(strings.Join(comments, " ")), cpuFigures(sec)
	if len(a) != 4 || len(b) != 4 {
		t.Fatalf("figures not found: deploy/daemonset.yaml %v, docs/operation.md %v", a, b)
	}
	if strings.Join(a, " ") != strings.Join(b, " ") {
		t.Errorf("deploy/daemonset.yaml quotes %v (apply, cleanup, both under 100m), docs/operation.md %v", a, b)
	}
}

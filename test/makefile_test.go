package test

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// helpBlock is one target's `## target: text` comment in the Makefile:
// the first line, which make help prints, and the lines after it.
type helpBlock struct {
	target, first string
	more          []string
	line          int
}

func helpBlocks(t *testing.T) []helpBlock {
	t.Helper()
	data, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	head := regexp.MustCompile(`^## ([a-z0-9-]+): (.*)$`)
	var blocks []helpBlock
	for i, line := range strings.Split(string(data), "\n") {
		if m := head.FindStringSubmatch(line); m != nil {
			blocks = append(blocks, helpBlock{target: m[1], first: m[2], line: i + 1})
			continue
		}
		if len(blocks) > 0 && strings.HasPrefix(line, "## ") && blocks[len(blocks)-1].line+len(blocks[len(blocks)-1].more) == i {
			b := &blocks[len(blocks)-1]
			b.more = append(b.more, strings.TrimPrefix(line, "## "))
		}
	}
	return blocks
}

// helpLineProblem says why a make help line reads as cut off ("" if not).
func helpLineProblem(first string, more []string) string {
	if strings.Count(first, "(") != strings.Count(first, ")") || strings.Count(first, "`")%2 != 0 {
		return "unbalanced parentheses or backquotes: the sentence goes on below"
	}
	for _, end := range []string{",", "(", ":", ";", " for", " and", " or", " the", " of", " to", " a", "'s", " with", " in"} {
		if strings.HasSuffix(first, end) {
			return "ends in " + strings.TrimSpace(end) + ": the sentence goes on below"
		}
	}
	if len(more) > 0 && !strings.HasPrefix(more[0], "(") {
		return "the lines below go on with the sentence (they must be a parenthesis of their own)"
	}
	return ""
}

// TestMakeHelpLinesWhole: make help prints each target's first `##` line;
// that line is a whole summary (what follows in the Makefile is a
// parenthesis of its own), every target it lists exists, and make help
// prints each line whole.
func TestMakeHelpLinesWhole(t *testing.T) {
	blocks := helpBlocks(t)
	if len(blocks) < 10 {
		t.Fatalf("%d help blocks: the parser is broken", len(blocks))
	}
	targets := makeTargets(t)
	for _, b := range blocks {
		if msg := helpLineProblem(b.first, b.more); msg != "" {
			t.Errorf("Makefile:%d: make help prints %q for %s: %s", b.line, b.first, b.target, msg)
		}
		if !targets[b.target] {
			t.Errorf("Makefile:%d: make help lists %s, which is not a target", b.line, b.target)
		}
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatal("make is not installed (Debian: make)")
	}
	out, err := exec.Command("make", "-s", "-C", "..", "help").Output()
	if err != nil {
		t.Fatalf("make help: %v", err)
	}
	for _, b := range blocks {
		if !strings.Contains(string(out), " "+b.target+" ") || !strings.Contains(string(out), b.first+"\n") {
			t.Errorf("make help does not print %s's line whole: %q\n%s", b.target, b.first, out)
		}
	}
}

// TestMakeHelpChecker: the lines that were cut off are caught.
func TestMakeHelpChecker(t *testing.T) {
	for first, more := range map[string][]string{
		"deps, and what test-kernels needs (qemu-system-x86,":              {"busybox-static, cpio, kmod, xz-utils)"},
		"only the tests that need no privileges, and the daemon loop's":    {"(internal/agent, against nft.Fake) statement coverage, which must stay 80%+"},
		"every fuzz target (each func Fuzz..., found by hack/fuzz.sh) for": {"FUZZTIME (default 30s) each"},
		"every fuzz target for a short fixed time each (CI: FuzzParse,":    {"FuzzCheck, FuzzFastPath, FuzzBuild, 10s each); seeds in */testdata/fuzz/"},
		"bin/manifests/install.yaml, uninstall.yaml and rollback.yaml":     {"for IMAGE:TAG (deploy/ rendered)"},
	} {
		if helpLineProblem(first, more) == "" {
			t.Errorf("%q passed", first)
		}
	}
	if msg := helpLineProblem("every fuzz target for FUZZTIME (default 30s) each", []string{"(each func Fuzz..., found by hack/fuzz.sh)"}); msg != "" {
		t.Errorf("a whole line: %s", msg)
	}
}

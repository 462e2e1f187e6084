package main

import (
	"bytes"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The flags the binary defines, as --help lists them: its own and the
// original's (the Flags part), and klog's (klogFlagNames).
func binaryFlags(t *testing.T) (flags, klog map[string]bool) {
	t.Helper()
	var out, errOut bytes.Buffer
	if code := run([]string{"--help"}, &out, &errOut); code != 0 {
		t.Fatalf("--help: exit %d %s", code, errOut.String())
	}
	help := out.String()
	_, help, _ = strings.Cut(help, "\nFlags:\n")
	help, _, _ = strings.Cut(help, "\nAccepted for")
	flags = map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z0-9_-]+)`).FindAllStringSubmatch(help, -1) {
		flags[m[1]] = true
	}
	klog = map[string]bool{}
	for _, f := range klogFlagNames {
		klog[f] = true
	}
	if len(flags) < 10 || !flags["config"] || !flags["v"] {
		t.Fatalf("--help lists %v: the parser is broken", slices.Sorted(maps.Keys(flags)))
	}
	return flags, klog
}

// section returns the text of a Markdown file from the heading to the next
// heading of the same or a higher level.
func section(t *testing.T, doc, heading string) string {
	t.Helper()
	level := strings.Index(heading, " ")
	_, rest, ok := strings.Cut(doc, "\n"+heading+"\n")
	if !ok {
		t.Fatalf("no heading %q", heading)
	}
	next := regexp.MustCompile(`(?m)^#{1,` + strconv.Itoa(level) + `} `)
	if loc := next.FindStringIndex(rest); loc != nil {
		rest = rest[:loc[0]]
	}
	return rest
}

var flagName = regexp.MustCompile("`--([a-z0-9_-]+)")

// tableFlags are the flags that begin the rows of a section's tables.
func tableFlags(text string) map[string]bool {
	out := map[string]bool{}
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, "| `--") {
			continue
		}
		cell, _, _ := strings.Cut(line[1:], "|")
		if m := flagName.FindStringSubmatch(cell); m != nil {
			out[m[1]] = true
		}
	}
	return out
}

// proseFlags are the flags a section's text outside its tables names.
func proseFlags(text string) map[string]bool {
	out := map[string]bool{}
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "|") {
			continue
		}
		for _, m := range flagName.FindAllStringSubmatch(line, -1) {
			out[m[1]] = true
		}
	}
	return out
}

func sameFlags(t *testing.T, what string, got, want map[string]bool) {
	t.Helper()
	var missing, extra []string
	for f := range want {
		if !got[f] {
			missing = append(missing, "--"+f)
		}
	}
	for f := range got {
		if !want[f] {
			extra = append(extra, "--"+f)
		}
	}
	slices.Sort(missing)
	slices.Sort(extra)
	if len(missing) > 0 || len(extra) > 0 {
		t.Errorf("%s: missing %v, not a flag of the binary %v", what, missing, extra)
	}
}

// TestFlagTablesMatchBinary: the flag tables of docs/configuration.md
// ("Flags") hold exactly the flags the binary defines, its klog paragraph
// exactly klog's; docs/flags.md's tables and its list of this agent's own
// flags together name every flag, and only flags. (The README has no flag
// table; it links configuration.md.)
func TestFlagTablesMatchBinary(t *testing.T) {
	flags, klog := binaryFlags(t)
	read := func(path string) string {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}

	conf := section(t, read("../../docs/configuration.md"), "## Flags")
	sameFlags(t, "docs/configuration.md, Flags: the tables", tableFlags(conf), flags)
	_, klogText, ok := strings.Cut(conf, "The original agent's logging flags")
	if !ok {
		t.Fatal("docs/configuration.md, Flags: no paragraph on the logging flags")
	}
	klogText, _, _ = strings.Cut(klogText, ". Logs") // its first sentence lists them
	sameFlags(t, "docs/configuration.md, Flags: the logging flags", proseFlags(klogText), klog)

	fl := read("../../docs/flags.md")
	theirs := tableFlags(section(t, fl, "## Their own flags"))
	klogTable := tableFlags(section(t, fl, "## klog's flags"))
	own := proseFlags(section(t, fl, "## This agent's own flags"))
	sameFlags(t, "docs/flags.md, klog's flags", klogTable, klog)
	all := map[string]bool{}
	maps.Copy(all, flags)
	maps.Copy(all, klog)
	union := map[string]bool{}
	for _, m := range []map[string]bool{theirs, klogTable, own} {
		maps.Copy(union, m)
	}
	sameFlags(t, "docs/flags.md, all its tables and lists", union, all)
	for f := range theirs {
		if !flags[f] {
			t.Errorf("docs/flags.md, Their own flags: --%s is not a flag of the binary", f)
		}
	}
}

// TestFlagTablesChecker: the comparison fails on a missing and on an
// extra flag.
func TestFlagTablesChecker(t *testing.T) {
	text := "| flag | default |\n| --- | --- |\n| `--a` | x |\n| `--b` (default 1) | y |\n\nprose `--c`\n"
	if got := tableFlags(text); !maps.Equal(got, map[string]bool{"a": true, "b": true}) {
		t.Errorf("tableFlags: %v", got)
	}
	if got := proseFlags(text); !maps.Equal(got, map[string]bool{"c": true}) {
		t.Errorf("proseFlags: %v", got)
	}
}

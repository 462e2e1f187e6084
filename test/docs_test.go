package test

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// The documentation's links: every relative link of README.md and docs/
// (and the other Markdown files at the top) names a file that exists, and
// every #anchor a heading of the file it points into, as GitHub renders
// them. Links to other sites are not fetched.

var (
	inlineLink = regexp.MustCompile(`\[[^\]]*\]\(([^()\s]+)(?:\s+"[^"]*")?\)`)
	refLink    = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*(\S+)`)
	codeSpan   = regexp.MustCompile("`[^`]*`")
	headingRE  = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	htmlAnchor = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
)

// markdownFiles are the files whose links are checked: every Markdown file
// of the repository (not the build's caches).
func markdownFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir("..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != ".." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "bin" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// githubAnchor is the anchor GitHub gives a heading: lower case, without
// punctuation but hyphens and underscores, spaces as hyphens.
func githubAnchor(heading string) string {
	heading = strings.ReplaceAll(heading, "`", "")
	// [text](link) in a heading anchors as text.
	heading = inlineLink.ReplaceAllStringFunc(heading, func(m string) string {
		return m[1:strings.Index(m, "](")]
	})
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// markdownLines returns the lines of a Markdown file outside fenced code
// blocks, with their numbers.
func markdownLines(data string) (lines []string, numbers []int) {
	fence := ""
	for i, line := range strings.Split(data, "\n") {
		trimmed := strings.TrimSpace(line)
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		lines = append(lines, line)
		numbers = append(numbers, i+1)
	}
	return lines, numbers
}

// anchors returns the anchors of a Markdown file's headings (and explicit
// <a name> or id anchors).
func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	seen := map[string]int{}
	lines, _ := markdownLines(string(data))
	for _, line := range lines {
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			out[m[1]] = true
		}
		m := headingRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		a := githubAnchor(m[1])
		if n := seen[a]; n > 0 {
			out[a+"-"+strconv.Itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// checkLink checks one link target of the Markdown file from; "" if good.
func checkLink(t *testing.T, from, target string) string {
	t.Helper()
	if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
		return ""
	}
	path, anchor, _ := strings.Cut(target, "#")
	file := from
	if path != "" {
		file = filepath.Join(filepath.Dir(from), filepath.FromSlash(path))
		if _, err := os.Stat(file); err != nil {
			return "no such file"
		}
	}
	if anchor == "" {
		return ""
	}
	if !strings.HasSuffix(file, ".md") {
		return "an anchor into a file that is not Markdown"
	}
	if !anchors(t, file)[anchor] {
		return "no heading with anchor #" + anchor + " in " + filepath.Base(file)
	}
	return ""
}

// TestDocsLinks: every relative link and anchor of the Markdown files
// resolves.
func TestDocsLinks(t *testing.T) {
	files := markdownFiles(t)
	if len(files) < 2 {
		t.Fatalf("found only %v", files)
	}
	checked := 0
	for _, from := range files {
		data, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		lines, numbers := markdownLines(string(data))
		for i, line := range lines {
			var targets []string
			if m := refLink.FindStringSubmatch(line); m != nil {
				targets = append(targets, m[1])
			}
			for _, m := range inlineLink.FindAllStringSubmatch(codeSpan.ReplaceAllString(line, ""), -1) {
				targets = append(targets, m[1])
			}
			for _, target := range targets {
				checked++
				if msg := checkLink(t, from, strings.Trim(target, "<>")); msg != "" {
					t.Errorf("%s:%d: link %s: %s", strings.TrimPrefix(from, "../"), numbers[i], target, msg)
				}
			}
		}
	}
	if checked == 0 {
		t.Error("no link found: the parser is broken")
	}
}

// TestDocsLinkChecker proves the checker fails on what it must.
func TestDocsLinkChecker(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "a.md")
	if err := os.WriteFile(a, []byte("# Title\n\n## The `table` is missing!\n\n```\n# not a heading\n```\n## Twice\n## Twice\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for target, bad := range map[string]bool{
		"a.md": false, "#title": false, "#the-table-is-missing": false, "a.md#twice-1": false,
		"b.md": true, "#not-a-heading": true, "a.md#nothing": true, "#twice-2": true,
		"https://example.com/x#y": false,
	} {
		if msg := checkLink(t, a, target); (msg != "") != bad {
			t.Errorf("%s: %q, want bad=%v", target, msg, bad)
		}
	}
}

// The per-node commands of the docs: every `kubectl exec` runs in the
// agent's pod on the node in question ($POD, found by the node's name, not
// ds/..., which picks any pod), and runs the binary at its path in the
// image (the Dockerfile's ENTRYPOINT). make e2e-cluster runs these
// commands on a real node; this test keeps every other doc page to the
// same form without a cluster.

var (
	kubectlExec = regexp.MustCompile(`kubectl(?:\s+-n\s+\S+)?\s+exec\s+(\S+)(?:\s+-c\s+\S+)?(?:\s+--\s+(\S+))?`)
	podAssign   = regexp.MustCompile(`POD=\$\(([^)]*)\)`)
	entrypoint  = regexp.MustCompile(`(?m)^ENTRYPOINT \["([^"]+)"\]`)
	podLabel    = regexp.MustCompile(`(?m)^      labels:\n        k8s-app: (\S+)`)
)

// perNodeProblems returns what in a Markdown text breaks the per-node form.
func perNodeProblems(text, binary, label string) []string {
	flat := strings.Join(strings.Fields(strings.ReplaceAll(text, "`", " ")), " ")
	wantPod := "kubectl -n kube-system get pod -l k8s-app=" + label + " --field-selector spec.nodeName=$NODE -o name"
	var out []string
	for _, m := range kubectlExec.FindAllStringSubmatch(flat, -1) {
		if m[1] != "$POD" {
			out = append(out, "kubectl exec "+m[1]+": not the pod on the node ($POD)")
		}
		if m[2] != "" && m[2] != binary {
			out = append(out, "kubectl exec "+m[1]+" -- "+m[2]+": the binary is "+binary+" in the image")
		}
	}
	for _, m := range podAssign.FindAllStringSubmatch(flat, -1) {
		if m[1] != wantPod {
			out = append(out, "POD=$("+m[1]+"): want POD=$("+wantPod+")")
		}
	}
	return out
}

func TestDocsPerNodeCommands(t *testing.T) {
	df, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	ds, err := os.ReadFile("../deploy/daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	ep, lb := entrypoint.FindSubmatch(df), podLabel.FindSubmatch(ds)
	if ep == nil || lb == nil {
		t.Fatalf("no ENTRYPOINT in the Dockerfile (%v) or pod label in deploy/daemonset.yaml (%v)", ep != nil, lb != nil)
	}
	binary, label := string(ep[1]), string(lb[1])
	execs := 0
	for _, f := range markdownFiles(t) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		execs += len(kubectlExec.FindAllString(string(data), -1))
		for _, p := range perNodeProblems(string(data), binary, label) {
			t.Errorf("%s: %s", strings.TrimPrefix(f, "../"), p)
		}
	}
	for _, f := range []string{"../README.md", "../docs/runbook.md"} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !podAssign.Match(data) {
			t.Errorf("%s does not say how to find the pod on the node (POD=$(...))", f)
		}
	}
	if execs < 5 {
		t.Errorf("found %d kubectl exec in the docs: the parser is broken", execs)
	}
	// The checker fails on what it must.
	for bad, want := range map[string]int{
		"`kubectl -n kube-system exec ds/ip-masq-agent-nft -- /ip-masq-agent diff`":                                   1,
		"kubectl -n kube-system exec $POD --\n   ip-masq-agent list":                                                  1,
		"POD=$(kubectl -n kube-system get pod -l k8s-app=ip-masq-agent-nft -o name | head -1)":                        1,
		"kubectl -n kube-system exec $POD -- /ip-masq-agent explain --live 10.1.2.3":                                  0,
		"POD=$(kubectl -n kube-system get pod -l k8s-app=" + label + " --field-selector spec.nodeName=$NODE -o name)": 0,
	} {
		if got := perNodeProblems(bad, binary, label); len(got) != want {
			t.Errorf("perNodeProblems(%q) = %q, want %d problems", bad, got, want)
		}
	}
}

// commentPath: a repository path named in a comment, at the start of a
// word (not inside ../other-repo/deploy), under one of the top
// directories.
var commentPath = regexp.MustCompile("(?:^|[\\s(`\"'])((?:deploy|examples|docs|hack|e2e|cmd|test|internal|config|nft|bench)/[A-Za-z0-9_./-]*)")

// TestDocsCommentPaths: every repository path that a comment of the
// manifests, the examples, the e2e overlays, the workflows or the
// Makefile names exists (a moved directory leaves no stale pointer).
func TestDocsCommentPaths(t *testing.T) {
	var files []string
	for _, dir := range []string{"../deploy", "../examples", "../e2e/overlay", "../e2e/uninstall", "../e2e/rollback", "../.github"} {
		err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() && (strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".yml")) {
				files = append(files, path)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	files = append(files, "../Makefile")
	checked := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(data), "\n") {
			_, comment, ok := strings.Cut(line, "#")
			if !ok {
				continue
			}
			for _, m := range commentPath.FindAllStringSubmatch(comment, -1) {
				p := strings.TrimRight(m[1], ".,:;")
				if strings.ContainsAny(p, "*<") || strings.Contains(p, "/.cache") {
					continue // a pattern; a cache the build makes
				}
				checked++
				if _, err := os.Stat(filepath.Join("..", p)); err != nil {
					t.Errorf("%s:%d: a comment names %s, which does not exist", strings.TrimPrefix(f, "../"), i+1, p)
				}
			}
		}
	}
	if checked == 0 {
		t.Error("no path found in the comments: the pattern is broken")
	}
	t.Logf("%d paths named in the comments of %d files", checked, len(files))
}

// tableProblems returns the table rows of a Markdown text that no table
// holds: a row ("| ... |") whose line above is not a row must be a
// table's header, followed by its delimiter row (| --- |). A blank line
// inside a table ends it, and GitHub shows the rows after it as text.
func tableProblems(text string) []string {
	lines, numbers := markdownLines(text)
	row := func(i int) bool {
		return i >= 0 && i < len(lines) && strings.HasPrefix(strings.TrimSpace(lines[i]), "|")
	}
	var problems []string
	for i := range lines {
		if !row(i) || row(i-1) {
			continue
		}
		if !row(i+1) || !tableDelimiter.MatchString(strings.TrimSpace(lines[i+1])) {
			problems = append(problems, "line "+strconv.Itoa(numbers[i])+": a table row outside a table (a blank line above it ends the table, or it lacks its | --- | line)")
		}
	}
	return problems
}

var tableDelimiter = regexp.MustCompile(`^\|(\s*:?-{3,}:?\s*\|)+$`)

func TestDocsTables(t *testing.T) {
	for _, path := range markdownFiles(t) {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range tableProblems(string(data)) {
			t.Errorf("%s: %s", path, p)
		}
	}
	good := "| a | b |\n| --- | --- |\n| 1 | 2 |\n"
	if p := tableProblems(good); len(p) != 0 {
		t.Errorf("a whole table: %v", p)
	}
	if p := tableProblems(good + "\n| 3 | 4 |\n"); len(p) != 1 {
		t.Errorf("a row after a blank line: %v, want one problem", p)
	}
}

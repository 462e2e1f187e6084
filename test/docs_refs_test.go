package test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Cross-references in prose name a section of a document by its heading:
// `README, "Priority"`, `(README: Roll back)`, `the README's Flags
// section`, `docs/operation.md: "Resources and rollout"`, `README's
// Verify`. Each must name a heading the document has (or the start of one:
// "README's Upgrade" is "Upgrade from the iptables agent"), in the
// Markdown files and in the comments and strings of the code, manifests,
// workflows and Makefile. Links with #anchors, in the code as in the
// Markdown, must resolve too.

var (
	docRef = regexp.MustCompile(`\b(README(?:\.md)?|[A-Za-z0-9_./-]+\.md)(?:'s)?(?:,|:)? "([A-Za-z][^"(){};]*)"`)
	// README: Install / README, Priority: a capitalized phrase.
	readmeColon = regexp.MustCompile(`\bREADME(?:\.md)?(?::|,) ([A-Z][A-Za-z0-9-]*(?: [A-Za-z0-9-]+)*)`)
	// the README's Flags section / README's Verify.
	readmeSection = regexp.MustCompile(`\bREADME(?:\.md)?'s ([A-Z][A-Za-z0-9-]*(?: [A-Za-z0-9-]+)*?) section\b`)
	readmeWord    = regexp.MustCompile(`\bREADME(?:\.md)?'s ([A-Z][A-Za-z0-9-]*)`)
	// docs/runbook.md#anchor in code and manifests.
	codeAnchor = regexp.MustCompile(`(?:^|[\s("'\x60/])((?:[A-Za-z0-9_.-]+/)*[A-Za-z0-9_.-]+\.md)#([A-Za-z0-9_-]+)`)
)

// crossRefFiles are the files whose prose is checked, besides the Markdown.
func crossRefFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir("..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != ".." && (strings.HasPrefix(d.Name(), ".") && d.Name() != ".github" || d.Name() == "bin" || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Name() == "docs_refs_test.go" {
			return nil // this file: its examples are wrong on purpose
		}
		switch ext := filepath.Ext(path); {
		case ext == ".md", ext == ".go", ext == ".yaml", ext == ".yml", ext == ".sh", d.Name() == "Makefile", d.Name() == "Dockerfile":
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// headings returns a Markdown file's headings, lower case.
func headings(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	lines, _ := markdownLines(string(data))
	for _, line := range lines {
		if m := headingRE.FindStringSubmatch(line); m != nil {
			out = append(out, strings.ToLower(strings.ReplaceAll(m[1], "`", "")))
		}
	}
	return out
}

// hasSection: a heading of doc is the phrase, starts with it, or is the
// phrase's first words (a sentence may go on after the name); or the
// document has an explicit anchor (<a id>) for the phrase.
func hasSection(t *testing.T, file string, phrase string) bool {
	hs := headings(t, file)
	if anchors(t, file)[githubAnchor(phrase)] {
		return true
	}
	phrase = strings.ToLower(strings.ReplaceAll(phrase, "`", ""))
	for _, h := range hs {
		if h == phrase || strings.HasPrefix(h, phrase+" ") || strings.HasPrefix(h, phrase+" (") || strings.HasPrefix(phrase, h+" ") {
			return true
		}
	}
	return false
}

// resolveDoc finds the Markdown file a reference names, relative to the
// repository's root or to the referring file.
func resolveDoc(from, name string) string {
	if name == "README" {
		name = "README.md"
	}
	for _, p := range []string{filepath.Join("..", name), filepath.Join(filepath.Dir(from), name), filepath.Join("../docs", name)} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// prose returns a file's text as one line: comment markers of code
// dropped, lines joined, so that a reference broken over lines is found.
func prose(path string, data []byte) string {
	lines := strings.Split(string(data), "\n")
	if !strings.HasSuffix(path, ".md") {
		marker := regexp.MustCompile(`^\s*(//|#)\s?`)
		for i, l := range lines {
			lines[i] = marker.ReplaceAllString(l, "")
		}
	}
	return strings.Join(lines, " ")
}

// crossRefProblems returns the references of one file that name no section.
func crossRefProblems(t *testing.T, from string, data []byte) (problems []string, checked int) {
	t.Helper()
	text := prose(from, data)
	check := func(doc, section, ref string) {
		file := resolveDoc(from, doc)
		if file == "" {
			return // not a document of this repository (another project's README)
		}
		checked++
		if !hasSection(t, file, section) {
			problems = append(problems, ref+": "+filepath.Base(file)+" has no section "+strings.TrimSpace(section))
		}
	}
	for _, m := range docRef.FindAllStringSubmatch(text, -1) {
		check(m[1], m[2], m[0])
	}
	for _, re := range []*regexp.Regexp{readmeColon, readmeSection, readmeWord} {
		for _, m := range re.FindAllStringSubmatch(text, -1) {
			check("README", m[1], m[0])
		}
	}
	if !strings.HasSuffix(from, ".md") { // TestDocsLinks checks the Markdown's links
		for _, m := range codeAnchor.FindAllStringSubmatch(string(data), -1) {
			file := resolveDoc(from, m[1])
			if file == "" {
				continue
			}
			checked++
			if !anchors(t, file)[m[2]] {
				problems = append(problems, m[1]+"#"+m[2]+": no heading with that anchor in "+filepath.Base(file))
			}
		}
	}
	return problems, checked
}

// TestDocsCrossReferences: every reference to a section of a document, in
// words or as a #anchor, names a section it has.
func TestDocsCrossReferences(t *testing.T) {
	checked := 0
	for _, f := range crossRefFiles(t) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		problems, n := crossRefProblems(t, f, data)
		checked += n
		for _, p := range problems {
			t.Errorf("%s: %s", strings.TrimPrefix(f, "../"), p)
		}
	}
	if checked < 20 {
		t.Errorf("only %d cross-references found: the patterns are broken", checked)
	}
	t.Logf("%d cross-references checked", checked)
}

// TestDocsCrossReferenceChecker proves the checker fails on what it must.
func TestDocsCrossReferenceChecker(t *testing.T) {
	for ref, bad := range map[string]bool{
		`(README, "Priority")`:                       true,
		`see the README's Flags section`:             true,
		`(README: The new rules)`:                    true,
		`docs/operation.md: "Resources and rollout"`: false,
		`(README: Roll back)`:                        false,
		`the README's Verify, Configure`:             false,
		`README "Upgrade"`:                           false,
		`docs/runbook.md#no-such-entry`:              true,
		`docs/upgrade.md#the-old-rules`:              false,
	} {
		problems, n := crossRefProblems(t, "../x.go", []byte("// "+ref+"\n"))
		if n == 0 || (len(problems) > 0) != bad {
			t.Errorf("%s: %d checked, problems %q; want bad %v", ref, n, problems, bad)
		}
	}
}

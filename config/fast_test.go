package config

// The fast path (fast.go) against the library path: for every input, Parse
// through each must give the same Config, warnings and errors, and the same
// decoder state (the findings with their keys and indexes, from which Check
// places its lines; the keys present and as written).

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
)

var allFlags = []Flags{{}, {EnableIPv6: true}, {NoMasqAllReservedRanges: true}, {EnableIPv6: true, NoMasqAllReservedRanges: true},
	{AzureDir: true}, {AzureDir: true, EnableIPv6: true}} // AzureDir: a file of a config directory (azure.go)

// samePaths parses data through both paths and fails t where they differ.
// It reports whether the fast path read data.
func samePaths(t testing.TB, data []byte, f Flags) bool {
	t.Helper()
	show := func() string {
		if len(data) > 300 {
			return fmt.Sprintf("%q... (%d bytes)", data[:300], len(data))
		}
		return strconv.Quote(string(data))
	}
	fc, fd, ferr := parseWith(data, f, true)
	sc, sd, serr := parseWith(data, f, false)
	if errString(ferr) != errString(serr) {
		t.Fatalf("%s %+v: error\nfast: %v\nfull: %v", show(), f, ferr, serr)
	}
	if !reflect.DeepEqual(fc, sc) {
		t.Fatalf("%s %+v: config\nfast: %#v\nfull: %#v", show(), f, fc, sc)
	}
	// The lists as decoded, item by item (the fast path keeps a list of
	// strings as it is).
	for _, d := range []*decoder{fd, sd} {
		if d != nil {
			for _, l := range d.lists {
				l.materialize()
			}
		}
	}
	if !reflect.DeepEqual(fd, sd) {
		t.Fatalf("%s %+v: decoder\nfast: %+v\nfull: %+v", show(), f, fd, sd)
	}
	// What Parse and Loader see.
	fc, fp, fw, ferr := parseKeysWith(data, f, true)
	sc, sp, sw, serr := parseKeysWith(data, f, false)
	if errString(ferr) != errString(serr) || !reflect.DeepEqual(fc, sc) || !reflect.DeepEqual(fp, sp) || !reflect.DeepEqual(fw, sw) {
		t.Fatalf("%s %+v: Parse\nfast: %v %v %q %v\nfull: %v %v %q %v", show(), f, fc, fp, fw, ferr, sc, sp, sw, serr)
	}
	if isJSON(data) {
		return false
	}
	_, _, ok := fastYAML(data)
	return ok
}

// testStrings returns every string literal in the package's test files:
// the inputs of the hand-written tests (edge cases, hostile inputs) among
// them.
func testStrings(t *testing.T) []string {
	files, err := filepath.Glob("*_test.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("test files: %v", err)
	}
	var out []string
	fset := token.NewFileSet()
	for _, name := range files {
		file, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if s, err := strconv.Unquote(lit.Value); err == nil {
					out = append(out, s)
				}
			}
			return true
		})
	}
	return out
}

// fuzzSeeds returns the inputs of the fuzz seed corpus (testdata/fuzz).
func fuzzSeeds(t *testing.T) []string {
	var out []string
	err := filepath.WalkDir("testdata/fuzz", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "[]byte("); ok {
				s, err := strconv.Unquote(strings.TrimSuffix(v, ")"))
				if err != nil {
					return fmt.Errorf("%s: %w", path, err)
				}
				out = append(out, s)
			}
		}
		return nil
	})
	if err != nil || len(out) == 0 {
		t.Fatalf("fuzz seeds: %d, %v", len(out), err)
	}
	return out
}

// fastShaped returns configs of the shape the fast path reads, large and
// small, valid and not, and near misses of it.
func fastShaped() []string {
	out := []string{
		string(configBlocks(10000)), string(configBlocks(100000)), string(config100k()),
		"cidrLimit: 100000\nnonMasqueradeCIDRs:\n" + strings.Repeat("- 10.0.0.0/24\n", 100000),
		"nonMasqueradeCIDRs:\n  - 10.0.0.0/8\n  - 172.16.0.0/12\n  - 192.168.0.0/16\ncidrLimit: 64\nmasqLinkLocal: false\nmasqLinkLocalIPv6: false\nresyncInterval: 60s\n",
		"# comment\n\nnonMasqueradeCIDRs: # the list\n  # first\n  - 10.0.0.0/8 # a comment\n\n  - \"10.1.0.0/16\"\n  - '10.2.0.0/16'   \n   # odd comment\nmasqueradeCIDRs:\n- 10.3.0.0/16\nmasqOutBound: false\n",
		"nonMasqueradeCIDRs:\n  - fd00::/8\n  - 2001:db8::/32\n  - ::ffff:10.0.0.0/104\n  - \"::/0\"\n  - \"::ffff:0:0/96\"\n",
		"nonMasqueradeCIDRs:\n  - 10.0.0.1/8\n  - 10.0.0.0/08\n  - 10.0.0.0/33\n  - 1/2\n  - a/b\n  - \" 10.0.0.0/8\"\n  - \"\"\n  - ''\n  - 'fe80::1%eth0/64'\n  - \"x\"\n",
		"nonMasqueradeCIDRs:\n" + cidrListItems(65, "  "),
		"nonMasqueradeCIDRs:\n" + cidrListItems(65, "  ") + "cidrLimit: 65\n",
		"cidrLimit: 1\nnonMasqueradeCIDRs:\n" + cidrListItems(3000, "") + "masqueradeCIDRs:\n" + cidrListItems(2, "    "),
		"nonMasqueradeCIDRs:\n", "nonMasqueradeCIDRs: []\n", "nonMasqueradeCIDRs: []\ncidrLimit: 0\n", "masqueradeCIDRs:\ncidrLimit:\n",
		"resyncInterval:\n", "resyncInterval: null\n", "resyncInterval: ~\n", "resyncInterval: \"1m\"\n", "resyncInterval: '5s' # c\n",
		"resyncInterval: 0s\n", "resyncInterval: 500ms\n", "resyncInterval: 1h2m3s\n", "resyncInterval: 60\n", "resyncInterval: bogus\n",
		"cidrLimit: 64.0\n", "cidrLimit: 0x40\n", "cidrLimit: 1e2\n", "cidrLimit: 0100\n", "cidrLimit: 1_000\n", "cidrLimit: -1\n",
		"cidrLimit: 99999999999999999999\n", "cidrLimit: .inf\n", "cidrLimit: \"5\"\n", "cidrLimit: yes\n", "cidrLimit: []\n",
		"masqLinkLocal: yes\n", "masqLinkLocal: Off\n", "masqLinkLocal: y\n", "masqLinkLocal: 1\n", "masqLinkLocal: 'true'\n", "masqLinkLocal: 2001-01-01\n",
		"masqLinkLocalIPv6: true\nmasqOutBoundIPv6: false\nmasqOutBound: true\n", "masqLinkLocal: -\n", "masqLinkLocal: --\n",
		"nonMasqueradeCIDRs: [10.0.0.0/8]\n", "nonMasqueradeCIDRs: 10.0.0.0/8\n", "nonMasqueradeCIDRs: \"\"\n",
		"masqueradeCIDRs: []\nnonMasqueradeCIDRs:\n- 10.0.0.0/8\n", "cidrLimit:\n  - 10.0.0.0/8\n", "masqLinkLocal:\n- 10.0.0.0/8\n",
	}
	// Near misses, one line in a config of the shape.
	items := []string{`- "10.0.0.0\/8"`, `- "a\"b/8"`, `- "\x31/8"`, `- 'it''s/8'`, `- "10.0.0.0/8" # c`, `- "10.0.0.0/8"#c`,
		`- '10.0.0.0/8'x`, `- "10.0.0.0/8`, "- \"a\n  b/8\"", "- 'a\n  b/8'", `- 10.0.0.0/8:`, `- 10.0.0.0/8: x`, `- a:b/c`,
		`- 10.0.0.0/8 10.1.0.0/16`, "- 10.0.0.0/8\t", `- &a 10.0.0.0/8`, `- *a`, `- !!str 10.0.0.0/8`, `- ? a/b`, `- [a/b]`,
		`- {a/b}`, "- |\n    a/b", "- >\n    a/b", "-\t10.0.0.0/8", `- -1/8`, `- .5/8`, `- /8`, `- 1/`, `- 0x10/8`, `- 1e3/8`,
		`- yes/8`, `- null/8`, `- ~/8`, `- 10.0.0.0/8#c`, `- 10.0.0.0/8 #c`, `-  10.0.0.0/8`, `- - 10.0.0.0/8`,
		"- 10.0.0.0/8\n    10.2.0.0/16", `-`, `- `, `- #c`, `- ""`, `- ''`, `- "#"`, `- ':'`, `- " - a"`, `- "a: b"`, `- 'a # b'`,
		`- "é/8"`, `- "a\ b/8"`, "- \"a\\\n  b/8\""}
	for _, it := range items {
		out = append(out, "cidrLimit: 10\nnonMasqueradeCIDRs:\n  - 10.0.0.0/8\n  "+it+"\n  - 10.1.0.0/16\n")
	}
	keys := []string{`cidrLimit: 5 # c`, `cidrLimit: 5#c`, `cidrLimit : 5`, `cidrLimit:5`, `"cidrLimit": 5`, "cidrLimit: 5\n  6",
		"cidrLimit: \"5\n  6\"", "cidrLimit: |\n  5", "cidrLimit: >-\n  5", `cidrLimit: !!str 5`, `cidrLimit: &x 5`, `cidrLimit: *x`,
		`cidrLimit: [5]`, `cidrLimit: {}`, `cidrLimit: [ ]`, `cidrLimit: "5" x`, `cidrLimit: '5'''`, `cidrLimit: "\x35"`,
		`masqueradeCIDRs: [] # c`, `masqueradeCIDRs: []x`, `masqueradeCIDRs: [],`, `resyncInterval: 1m # c`, `resyncInterval: 1m#c`,
		`resyncInterval: 1m 2s`, `resyncInterval: "1m 2s"`, `resyncInterval: 1m:2s`, `resyncInterval: a/b`, `resyncInterval: -`,
		`resyncInterval: -1s`, `resyncInterval: +1s`, `resyncInterval: .5s`, `resyncInterval: ...`, `resyncInterval: ---`, `resyncInterval: <<`,
		"masqueradeCIDRs: &x\n  - 10.2.0.0/16", "masqueradeCIDRs: !!seq\n  - 10.2.0.0/16", "masqueradeCIDRs:\n  - 10.2.0.0/16\n - 10.3.0.0/16",
		"masqueradeCIDRs:\n   - 10.2.0.0/16\n  - 10.3.0.0/16", "masqueradeCIDRs:\n  - 10.2.0.0/16\n    - 10.3.0.0/16",
		"masqueradeCIDRs:\n  cidrLimit: 5", "  cidrLimit: 5", "cidrLimit: 5\n  - 10.2.0.0/16", "cidrLimit: 5\n# c\n  x: 1",
		"masqLinkLocal: true\nmasqLinkLocal: true", "masqLinkLocal: true\nMasqLinkLocal: true", "--- \ncidrLimit: 5", "cidrLimit: 5\n---",
		"cidrLimit: 5\n...", "%YAML 1.1\n---\ncidrLimit: 5", "? cidrLimit\n: 5", "<<: {cidrLimit: 5}", "cidrLimit: 5\n\n\n"}
	for _, k := range keys {
		out = append(out, k+"\nnonMasqueradeCIDRs:\n- 10.0.0.0/8\n", "nonMasqueradeCIDRs:\n- 10.0.0.0/8\n"+k+"\n")
	}
	return out
}

func cidrListItems(n int, indent string) string {
	var b strings.Builder
	for _, h := range hosts(n) {
		b.WriteString(indent + "- " + h + "\n")
	}
	return b.String()
}

// mutate changes a fast-shaped config in one of the ways that the fast
// path must notice (or that it must read as the library does).
func mutate(r *rand.Rand, s string) string {
	lines := strings.Split(s, "\n")
	i := r.IntN(len(lines))
	ins := []string{"\t", "\r", " ", "  ", "#", " #", ":", ": ", "-", "- ", "---", "...", "\"", "'", "\\", "[", "]", "{", "}",
		"&a ", "*a", "!!str ", "|", ">", "?", "%", "@", "`", ",", "/", "::", "\xef\xbb\xbf", "\u00e9", "null", "~", "yes", "0x"}
	switch r.IntN(9) {
	case 0: // insert a character or an indicator
		l := lines[i]
		at := r.IntN(len(l) + 1)
		lines[i] = l[:at] + ins[r.IntN(len(ins))] + l[at:]
	case 1: // indent a line more or less
		if r.IntN(2) == 0 {
			lines[i] = strings.Repeat(" ", 1+r.IntN(4)) + lines[i]
		} else {
			lines[i] = strings.TrimPrefix(lines[i], " ")
		}
	case 2: // duplicate a line elsewhere
		lines = append(lines[:i], append([]string{lines[r.IntN(len(lines))]}, lines[i:]...)...)
	case 3: // delete a line
		lines = append(lines[:i], lines[i+1:]...)
	case 4: // change a key's case or spelling
		keys := append(knownKeys[:], "NonMasqueradeCIDRs", "cidrlimit", "foo", "1", "<<", "? cidrLimit")
		if k, v, ok := strings.Cut(lines[i], ":"); ok && !strings.HasPrefix(k, " ") && !strings.HasPrefix(k, "-") {
			lines[i] = keys[r.IntN(len(keys))] + ":" + v
		}
	case 5: // add a key line
		vals := []string{"", " 5", " true", " 1m", " []", " null", " \"x\"", " [10.0.0.0/8]", " 10.0.0.0/8"}
		lines = append(lines[:i], append([]string{knownKeys[r.IntN(len(knownKeys))] + ":" + vals[r.IntN(len(vals))]}, lines[i:]...)...)
	case 6: // add an item
		items := []string{"- 10.9.0.0/16", "  - 10.9.0.0/16", "-", "- ", "- null", "- ~", "- \"\"", "- - x", "- a: b", "- fd00::/8", "- 10.0.0.0/8:"}
		lines = append(lines[:i], append([]string{items[r.IntN(len(items))]}, lines[i:]...)...)
	case 7: // add a document marker or a directive
		marks := []string{"---", "...", "--- ", "%YAML 1.1", "---\ncidrLimit: 1"}
		lines = append(lines[:i], append([]string{marks[r.IntN(len(marks))]}, lines[i:]...)...)
	default: // cut the file short
		j := strings.Join(lines, "\n")
		return j[:r.IntN(len(j)+1)]
	}
	return strings.Join(lines, "\n")
}

// fastInput is a config for the differential tests, and where it comes from.
type fastInput struct{ from, data string }

// fastPathInputs returns the inputs of the differential tests: the parity
// corpus, every string literal of the tests, the fuzz seeds, configs of the
// fast path's shape (the 100,000-CIDR ones among them) and 4,000 seeded
// mutations of them.
func fastPathInputs(t *testing.T) []fastInput {
	type input = fastInput
	var inputs []input
	for _, tc := range append(handWrittenCases(), generatedCases(400)...) {
		inputs = append(inputs, input{"parity " + tc.name, tc.data})
	}
	for i, s := range testStrings(t) {
		inputs = append(inputs, input{fmt.Sprintf("test literal %d", i), s})
	}
	for i, s := range fuzzSeeds(t) {
		inputs = append(inputs, input{fmt.Sprintf("fuzz seed %d", i), s})
	}
	shaped := fastShaped()
	for i, s := range shaped {
		inputs = append(inputs, input{fmt.Sprintf("fast-shaped %d", i), s})
	}
	r := rand.New(rand.NewPCG(11, 2025))
	var read, missed []string // small configs that the fast path reads, and that it leaves
	for _, s := range shaped {
		if _, _, ok := fastYAML([]byte(s)); len(s) >= 4000 {
			continue
		} else if ok {
			read = append(read, s)
		} else {
			missed = append(missed, s)
		}
	}
	for i := range 4000 {
		s := read[r.IntN(len(read))]
		if i%4 == 0 {
			s = missed[r.IntN(len(missed))]
		}
		for range 1 + r.IntN(3) {
			s = mutate(r, s)
		}
		inputs = append(inputs, input{fmt.Sprintf("mutation %d", i), s})
	}
	return inputs
}

// largeInput: the 100,000-CIDR configs (seconds each through the library
// path under -race), which TestFastPathSameAsFullLarge compares, built
// without -race (fast_large_test.go; make test runs it in a go test of its
// own).
func largeInput(data string) bool { return len(data) > 200_000 }

// TestFastPathSameAsFull: the fast path and the library path read every
// input alike (the 100,000-CIDR ones: TestFastPathSameAsFullLarge).
func TestFastPathSameAsFull(t *testing.T) {
	inputs := fastPathInputs(t)
	shaped := fastShaped()
	r := rand.New(rand.NewPCG(12, 2025))
	fast := map[string]int{}
	for _, in := range inputs {
		kind, _, _ := strings.Cut(in.from, " ")
		flags := allFlags
		switch {
		case largeInput(in.data):
			continue
		case len(in.data) > 50_000:
			flags = flags[:1]
		case kind == "mutation":
			// The flags change only the checks of the values, after
			// either path: one set per mutation.
			i := r.IntN(len(flags))
			flags = flags[i : i+1]
		}
		for _, f := range flags {
			if samePaths(t, []byte(in.data), f) {
				fast[kind]++
			}
		}
	}
	t.Logf("%d inputs, up to %d flag sets each; (input, flags) read by the fast path, by source: %v", len(inputs), len(allFlags), fast)
	for _, s := range shaped[:4] { // the large ones, read by the fast path
		if _, _, ok := fastYAML([]byte(s)); !ok {
			t.Errorf("the fast path does not read a large config (%q...)", s[:40])
		}
	}
	if fast["mutation"] < 500 || fast["parity"] < 200 || fast["test"] < 500 {
		t.Errorf("too few inputs took the fast path: %v", fast)
	}
}

// Load and Loader read files through the fast path too.
func TestFastPathLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ip-masq-agent")
	data := configBlocks(10000)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	c, warns, err := (&Loader{}).Load(path, v4Only)
	want, _, _, _ := parseKeysWith(data, v4Only, false)
	if err != nil || len(warns) != 0 || !reflect.DeepEqual(c, want) {
		t.Fatalf("Load: %d CIDRs, %q, %v", len(c.NonMasqueradeCIDRs), warns, err)
	}
}

// FuzzFastPath compares the two paths on random input, starting from
// configs of the fast path's shape.
func FuzzFastPath(f *testing.F) {
	for _, s := range fastShaped() {
		if len(s) < 4000 {
			f.Add([]byte(s), false, false)
		}
	}
	for _, tc := range handWrittenCases() {
		f.Add([]byte(tc.data), true, true)
	}
	f.Fuzz(func(t *testing.T, data []byte, ipv6, reserved bool) {
		samePaths(t, data, Flags{EnableIPv6: ipv6, NoMasqAllReservedRanges: reserved})
	})
}

// TestParseKeepsNoBytes: nothing Parse (or Check) returns refers to its input's
// bytes (fastYAML's items alias them, and the Loader reads the next file
// into the buffer of the one before): the input overwritten after Parse
// changes neither the config, nor the warnings, nor the error.
func TestParseKeepsNoBytes(t *testing.T) {
	n := 0
	for _, in := range fastPathInputs(t) {
		if largeInput(in.data) {
			continue
		}
		for _, f := range []Flags{allFlags[0], {EnableIPv6: true}, {AzureDir: true}} {
			data := []byte(in.data)
			c, warns, err := Parse(data, f)
			want, wantWarns, wantErr := Parse([]byte(in.data), f)
			for i := range data {
				data[i] = 'x'
			}
			if !reflect.DeepEqual(c, want) || !slices.Equal(warns, wantWarns) || fmt.Sprint(err) != fmt.Sprint(wantErr) {
				t.Fatalf("%s: what Parse returned changed with its input's bytes:\n%+v\n%q %v\nwant\n%+v\n%q %v",
					in.from, c, warns, err, want, wantWarns, wantErr)
			}
			if _, _, ok := fastYAML([]byte(in.data)); ok && err == nil {
				n++
			}
			data = []byte(in.data)
			problems := Check(data, f, true)
			wantProblems := fmt.Sprint(Check([]byte(in.data), f, true))
			for i := range data {
				data[i] = 'x'
			}
			if got := fmt.Sprint(problems); got != wantProblems {
				t.Fatalf("%s: what Check returned changed with its input's bytes:\n%s\nwant\n%s", in.from, got, wantProblems)
			}
		}
	}
	if n < 500 {
		t.Errorf("only %d good configs read by the fast path", n)
	}
}

// TestLoaderReusesNoBytes: the Loader reads each file into the buffer of
// the read before (or, when the file is unchanged, of that read): each
// Load gives its file's config, and what it gave stays as it was through
// the loads after it.
func TestLoaderReusesNoBytes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ip-masq-agent")
	files := []string{
		"nonMasqueradeCIDRs:\n  - 10.0.0.0/8\nmasqueradeCIDRs:\n  - \"10.0.0.0/16\"\nmasqLinkLocal: true\n",
		"nonMasqueradeCIDRs:\n  - 10.1.0.0/16\n  - 10.0.0.0/8\nresyncInterval: 1s\n",
		"# a comment: what follows is at other offsets\nnonMasqueradeCIDRs:\n  - 10.0.0.0/8\n",
		"nonMasqueradeCIDRs:\n  - 11.0.0.0/8\nmasqueradeCIDRs:\n  - \"11.0.0.0/16\"\nmasqLinkLocal: true\n", // file 0's length
	}
	for i, s := range files {
		if _, _, ok := fastYAML([]byte(s)); !ok {
			t.Fatalf("file %d is not read by the fast path", i)
		}
	}
	if len(files[3]) != len(files[0]) {
		t.Fatal("files 0 and 3 differ in length: a read into the wrong buffer would go unseen")
	}
	l := &Loader{}
	type got struct {
		file  int
		c     Config
		warns []string
	}
	var loads []got
	for _, i := range []int{0, 0, 3, 3, 0, 1, 1, 2, 0, 2, 3} { // unchanged reads too
		if err := os.WriteFile(path, []byte(files[i]), 0o644); err != nil {
			t.Fatal(err)
		}
		c, warns, err := l.Load(path, Flags{EnableIPv6: true})
		if err != nil {
			t.Fatalf("file %d: %v", i, err)
		}
		loads = append(loads, got{i, c, warns})
	}
	for n, ld := range loads {
		want, wantWarns, _ := Parse([]byte(files[ld.file]), Flags{EnableIPv6: true})
		for j := range wantWarns {
			wantWarns[j] = path + ": " + wantWarns[j]
		}
		if !reflect.DeepEqual(ld.c, want) || !slices.Equal(ld.warns, wantWarns) {
			t.Errorf("load %d (file %d) gave, or changed after the loads that followed it to:\n%+v\n%q\nwant\n%+v\n%q", n, ld.file, ld.c, ld.warns, want, wantWarns)
		}
	}
	if len(loads[0].warns) == 0 || len(loads[5].c.NonMasqueradeCIDRs) != 2 { // loads[5]: file 1
		t.Errorf("the files do not give what this test is about: %+v", loads)
	}
}

// TestPrintable: printable, eight bytes at a time, is the byte test of
// fast.go's shape, for every byte value at every position of a word.
func TestPrintable(t *testing.T) {
	ref := func(data []byte) bool {
		for _, c := range data {
			if c != '\n' && (c < ' ' || c > '~') {
				return false
			}
		}
		return true
	}
	base := []byte("nonMasqueradeCIDRs:\n  - 10.0.0.0/8\n")
	for n := range len(base) {
		for c := range 256 {
			data := slices.Clone(base)
			data[n] = byte(c)
			if got, want := printable(data[:]), ref(data); got != want {
				t.Fatalf("byte %#x at %d: printable %v, want %v", c, n, got, want)
			}
		}
	}
	r := rand.New(rand.NewPCG(34, 7))
	for range 20000 {
		data := make([]byte, r.IntN(40))
		for i := range data {
			data[i] = byte(' ' + r.IntN(95))
			if r.IntN(30) == 0 {
				data[i] = byte(r.IntN(256))
			}
		}
		if got, want := printable(data), ref(data); got != want {
			t.Fatalf("%q: printable %v, want %v", data, got, want)
		}
	}
}

// TestLoaderAnotherPath: a Loader asked for another path with the same
// bytes reads it as that path's (its warnings name it), not as the last.
func TestLoaderAnotherPath(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	data := []byte("nonMasqueradeCIDRs:\n  - 10.0.0.0/8\nmasqueradeCIDRs:\n  - \"10.0.0.0/16\"\n")
	for _, p := range []string{a, b} {
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	l := &Loader{}
	for _, p := range []string{a, b, a} {
		_, warns, err := l.Load(p, v4Only)
		if err != nil || len(warns) == 0 || !strings.HasPrefix(warns[0], p+": ") {
			t.Fatalf("Load(%s): %q, %v", p, warns, err)
		}
	}
}

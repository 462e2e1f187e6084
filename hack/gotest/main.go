// Command gotest runs `go test -json` with the given flags and packages and
// prints what `go test` prints without -v (an ok line per package; the whole
// output of each failed test; build errors, panics and FAIL lines), writes
// the verbose transcript to a log file, and ends with one line that counts
// the skipped tests and gives their reasons. It exits with go test's status.
//
//	gotest [-go go] [-log bin/test.out] [-name "make test"] -- [go test flags] [packages]
//
// `make test` uses it so that a run where the kernel tests skipped (without
// root) says so, where plain `go test` would show only "ok" lines.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"slices"
	"sort"
	"strings"
)

func main() {
	goBin := flag.String("go", "go", "the go command")
	logPath := flag.String("log", "", "write the verbose transcript (every test's output) to this file")
	name := flag.String("name", "go test", "the name the last line starts with")
	flag.Parse()
	os.Exit(run(*goBin, *logPath, *name, flag.Args()))
}

func run(goBin, logPath, name string, args []string) int {
	log := io.Discard
	if logPath != "" {
		f, err := os.Create(logPath)
		if err != nil {
			fmt.Fprintln(os.Stderr, "gotest:", err)
			return 2
		}
		defer f.Close()
		log = f
	}
	cmd := exec.Command(goBin, append([]string{"test", "-json"}, args...)...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, "gotest:", err)
		return 2
	}
	// Ctrl-C reaches go test too (same process group): keep reading until
	// it has reported what it ran.
	signal.Ignore(os.Interrupt)
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "gotest:", err)
		return 2
	}
	s := newSummary(os.Stdout, log)
	s.read(stdout)
	err = cmd.Wait()
	fmt.Println(s.line(name))
	if logPath != "" {
		fmt.Printf("%s: the full output is in %s\n", name, logPath)
	}
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit) && exit.ExitCode() > 0:
		return exit.ExitCode()
	default:
		fmt.Fprintln(os.Stderr, "gotest:", err)
		return 1
	}
}

// event is one line of `go test -json` (cmd/test2json, and go test's build
// events).
type event struct {
	Action     string
	Package    string
	ImportPath string // build-output, build-fail
	Test       string
	Output     string
}

// summary turns the events into go test's non-verbose output.
type summary struct {
	out, log io.Writer
	// Output of each top-level test (subtests included) until it ends, and
	// of each package outside its tests.
	tests map[string][]string // key: package + "\x00" + top-level test
	order map[string][]string // package: its top-level tests in start order
	pkg   map[string][]string
	// The output lines of each test (full name), for a skip's reason.
	lines   map[string][]string
	ran     int
	skipped map[string]int // reason: count
}

func newSummary(out, log io.Writer) *summary {
	return &summary{
		out: out, log: log,
		tests: map[string][]string{}, order: map[string][]string{},
		pkg: map[string][]string{}, lines: map[string][]string{},
		skipped: map[string]int{},
	}
}

func (s *summary) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			// Not an event: go test's own words.
			fmt.Fprintf(s.out, "%s\n", line)
			fmt.Fprintf(s.log, "%s\n", line)
			continue
		}
		s.event(e)
	}
}

func (s *summary) event(e event) {
	if e.Output != "" {
		fmt.Fprint(s.log, e.Output)
	}
	top, _, _ := strings.Cut(e.Test, "/")
	key := e.Package + "\x00" + top
	switch {
	case e.Action == "build-output":
		fmt.Fprint(s.out, e.Output)
	case e.Test == "" && e.Action == "output":
		s.pkg[e.Package] = append(s.pkg[e.Package], e.Output)
	case e.Test == "":
		s.packageDone(e)
	case e.Action == "output":
		if _, ok := s.tests[key]; !ok {
			s.order[e.Package] = append(s.order[e.Package], top)
		}
		s.tests[key] = append(s.tests[key], e.Output)
		s.lines[e.Package+"\x00"+e.Test] = append(s.lines[e.Package+"\x00"+e.Test], e.Output)
	case e.Action == "pass" || e.Action == "fail" || e.Action == "skip":
		s.ran++
		if e.Action == "skip" {
			s.skipped[reason(s.lines[e.Package+"\x00"+e.Test])]++
		}
		delete(s.lines, e.Package+"\x00"+e.Test)
		if e.Test != top {
			return // a subtest: its parent decides
		}
		if e.Action == "fail" {
			s.print(s.tests[key])
		}
		delete(s.tests, key)
	}
}

// packageDone prints the package's ok, "?" or FAIL lines and, when it failed,
// the output of its tests that never ended (a panic, a timeout).
func (s *summary) packageDone(e event) {
	lines := s.pkg[e.Package]
	delete(s.pkg, e.Package)
	order := s.order[e.Package]
	delete(s.order, e.Package)
	switch e.Action {
	case "pass", "skip":
		for _, l := range lines {
			if strings.HasPrefix(l, "ok ") || strings.HasPrefix(l, "ok\t") || strings.HasPrefix(l, "?") {
				fmt.Fprint(s.out, l)
			}
		}
	case "fail":
		for _, top := range order {
			s.print(s.tests[e.Package+"\x00"+top])
		}
		s.print(lines)
	default:
		return
	}
	for _, top := range order {
		delete(s.tests, e.Package+"\x00"+top)
	}
}

func (s *summary) print(lines []string) {
	for _, l := range lines {
		fmt.Fprint(s.out, l)
	}
}

var fileLine = regexp.MustCompile(`^\S+\.go:\d+: `)

// reason is the last line a skipped test wrote before "--- SKIP", without
// its file:line prefix.
func reason(lines []string) string {
	for _, l := range slices.Backward(lines) {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "=== ") || strings.HasPrefix(l, "--- ") {
			continue
		}
		return fileLine.ReplaceAllString(l, "")
	}
	return "no reason given"
}

// line is the last line: how many tests ran, how many skipped and why.
func (s *summary) line(name string) string {
	total := 0
	for _, n := range s.skipped {
		total += n
	}
	if total == 0 {
		tests := "tests"
		if s.ran == 1 {
			tests = "test"
		}
		return fmt.Sprintf("%s: %d %s ran, none skipped", name, s.ran, tests)
	}
	reasons := make([]string, 0, len(s.skipped))
	for r := range s.skipped {
		reasons = append(reasons, r)
	}
	sort.Slice(reasons, func(i, j int) bool {
		if s.skipped[reasons[i]] != s.skipped[reasons[j]] {
			return s.skipped[reasons[i]] > s.skipped[reasons[j]]
		}
		return reasons[i] < reasons[j]
	})
	for i, r := range reasons {
		reasons[i] = fmt.Sprintf("%d: %s", s.skipped[r], r)
	}
	return fmt.Sprintf("%s: %d of %d tests skipped (%s)", name, total, s.ran, strings.Join(reasons, "; "))
}

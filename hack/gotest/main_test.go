package main

import (
	"strings"
	"testing"
)

// A stream as `go test -json` writes it: a passing package, a failing one
// (a failed subtest, a passed test, a panic in a test that never ended) and
// skips with and without a reason.
const stream = `{"Action":"start","Package":"ex/a"}
{"Action":"run","Package":"ex/a","Test":"TestKernel"}
{"Action":"output","Package":"ex/a","Test":"TestKernel","Output":"=== RUN   TestKernel\n"}
{"Action":"output","Package":"ex/a","Test":"TestKernel","Output":"    require.go:101: testnet: needs root (euid is 65534)\n"}
{"Action":"output","Package":"ex/a","Test":"TestKernel","Output":"--- SKIP: TestKernel (0.00s)\n"}
{"Action":"skip","Package":"ex/a","Test":"TestKernel"}
{"Action":"run","Package":"ex/a","Test":"TestKernel2"}
{"Action":"output","Package":"ex/a","Test":"TestKernel2","Output":"=== RUN   TestKernel2\n"}
{"Action":"output","Package":"ex/a","Test":"TestKernel2","Output":"    a_test.go:9: testnet: needs root (euid is 65534)\n"}
{"Action":"output","Package":"ex/a","Test":"TestKernel2","Output":"--- SKIP: TestKernel2 (0.00s)\n"}
{"Action":"skip","Package":"ex/a","Test":"TestKernel2"}
{"Action":"run","Package":"ex/a","Test":"TestPure"}
{"Action":"output","Package":"ex/a","Test":"TestPure","Output":"=== RUN   TestPure\n"}
{"Action":"output","Package":"ex/a","Test":"TestPure","Output":"    a_test.go:20: a log line of a passing test\n"}
{"Action":"output","Package":"ex/a","Test":"TestPure","Output":"--- PASS: TestPure (0.00s)\n"}
{"Action":"pass","Package":"ex/a","Test":"TestPure"}
{"Action":"output","Package":"ex/a","Output":"PASS\n"}
{"Action":"output","Package":"ex/a","Output":"ok  \tex/a\t0.01s\n"}
{"Action":"pass","Package":"ex/a"}
{"Action":"start","Package":"ex/b"}
{"Action":"run","Package":"ex/b","Test":"TestTable"}
{"Action":"output","Package":"ex/b","Test":"TestTable","Output":"=== RUN   TestTable\n"}
{"Action":"run","Package":"ex/b","Test":"TestTable/one"}
{"Action":"output","Package":"ex/b","Test":"TestTable/one","Output":"=== RUN   TestTable/one\n"}
{"Action":"output","Package":"ex/b","Test":"TestTable/one","Output":"    b_test.go:5: got 1, want 2\n"}
{"Action":"output","Package":"ex/b","Test":"TestTable/one","Output":"    --- FAIL: TestTable/one (0.00s)\n"}
{"Action":"fail","Package":"ex/b","Test":"TestTable/one"}
{"Action":"run","Package":"ex/b","Test":"TestTable/two"}
{"Action":"output","Package":"ex/b","Test":"TestTable/two","Output":"=== RUN   TestTable/two\n"}
{"Action":"output","Package":"ex/b","Test":"TestTable/two","Output":"    --- SKIP: TestTable/two (0.00s)\n"}
{"Action":"skip","Package":"ex/b","Test":"TestTable/two"}
{"Action":"output","Package":"ex/b","Test":"TestTable","Output":"--- FAIL: TestTable (0.00s)\n"}
{"Action":"fail","Package":"ex/b","Test":"TestTable"}
{"Action":"run","Package":"ex/b","Test":"TestOK"}
{"Action":"output","Package":"ex/b","Test":"TestOK","Output":"=== RUN   TestOK\n"}
{"Action":"output","Package":"ex/b","Test":"TestOK","Output":"--- PASS: TestOK (0.00s)\n"}
{"Action":"pass","Package":"ex/b","Test":"TestOK"}
{"Action":"run","Package":"ex/b","Test":"TestPanic"}
{"Action":"output","Package":"ex/b","Test":"TestPanic","Output":"=== RUN   TestPanic\n"}
{"Action":"output","Package":"ex/b","Test":"TestPanic","Output":"panic: boom\n"}
{"Action":"output","Package":"ex/b","Output":"FAIL\tex/b\t0.02s\n"}
{"Action":"fail","Package":"ex/b"}
{"ImportPath":"ex/c","Action":"build-output","Output":"ex/c/c.go:3:1: syntax error\n"}
{"ImportPath":"ex/c","Action":"build-fail"}
{"Action":"output","Package":"ex/c","Output":"FAIL\tex/c [build failed]\n"}
{"Action":"fail","Package":"ex/c"}
{"Action":"output","Package":"ex/d","Output":"?   \tex/d\t[no test files]\n"}
{"Action":"skip","Package":"ex/d"}
FAIL
`

func TestSummary(t *testing.T) {
	var out, log strings.Builder
	s := newSummary(&out, &log)
	s.read(strings.NewReader(stream))
	want := `ok  	ex/a	0.01s
=== RUN   TestTable
=== RUN   TestTable/one
    b_test.go:5: got 1, want 2
    --- FAIL: TestTable/one (0.00s)
=== RUN   TestTable/two
    --- SKIP: TestTable/two (0.00s)
--- FAIL: TestTable (0.00s)
=== RUN   TestPanic
panic: boom
FAIL	ex/b	0.02s
ex/c/c.go:3:1: syntax error
FAIL	ex/c [build failed]
?   	ex/d	[no test files]
FAIL
`
	if out.String() != want {
		t.Errorf("output:\n%s\nwant:\n%s", out.String(), want)
	}
	if !strings.Contains(log.String(), "a log line of a passing test") {
		t.Errorf("the log lacks the passing test's output:\n%s", log.String())
	}
	if got, want := s.line("make test"), "make test: 3 of 7 tests skipped (2: testnet: needs root (euid is 65534); 1: no reason given)"; got != want {
		t.Errorf("last line %q, want %q", got, want)
	}
	none := newSummary(&out, &log)
	none.read(strings.NewReader(`{"Action":"pass","Package":"ex/a","Test":"TestPure"}` + "\n"))
	if got, want := none.line("make test"), "make test: 1 test ran, none skipped"; got != want {
		t.Errorf("last line %q, want %q", got, want)
	}
}

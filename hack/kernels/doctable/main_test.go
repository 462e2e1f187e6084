package main

import (
	"os"
	"strings"
	"testing"
)

// TestDocMatchesMeasurements: docs/kernels.md's kernel table is the one
// docs/kernels.tsv (what make test-kernels measured) makes.
func TestDocMatchesMeasurements(t *testing.T) {
	tsv, err := os.ReadFile("../../../docs/kernels.tsv")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../../../docs/kernels.md")
	if err != nil {
		t.Fatal(err)
	}
	table, err := Table(string(tsv))
	if err != nil {
		t.Fatal(err)
	}
	want, err := Replace(string(doc), table)
	if err != nil {
		t.Fatal(err)
	}
	if want != string(doc) {
		t.Errorf("docs/kernels.md's kernel table is not what docs/kernels.tsv measured; run go run ./hack/kernels/doctable -w. Want:\n%s", table)
	}
}

func TestTableOrderAndFields(t *testing.T) {
	tsv := "series\tkernel\tpackage\tmode\tpassed\tfailed\tskipped\tseconds\ttests\tskip\tdate\tcommit\n" +
		"6.18\t6.18.1\t-\towned\t3\t0\t0\t9\tSmoke\t-\t2026-11-25\tabc1234\n" +
		"5.10\t5.10.0-46-amd64\tlinux-image-5.10.0-46-amd64-unsigned\tverify-and-repair\t2\t1\t0\t90\t.\t^(A|B)\t2026-11-25\tabc1234+changes\n"
	table, err := Table(tsv)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[2], "| 5.10.0-46-amd64 | qemu guest") || !strings.HasPrefix(lines[3], "| 6.18.1 | the host's") {
		t.Errorf("table:\n%s", table)
	}
	if !strings.Contains(lines[2], "verified and repaired | 2 | 1 | 0 | `.` but `^(A\\|B)`") {
		t.Errorf("row %q", lines[2])
	}
	// The subskipped column (run.sh adds it, "-" for older rows): a
	// count other than 0 shows next to the top-level skips.
	sub := "series\tkernel\tpackage\tmode\tpassed\tfailed\tskipped\tseconds\ttests\tskip\tdate\tcommit\tsubskipped\n" +
		"6.1\t6.1.0-56-amd64\tlinux-image-6.1.0-56-amd64-unsigned\tverify-and-repair\t5\t0\t0\t300\t.\t-\t2026-11-26\tabc1234\t2\n" +
		"6.12\t6.12.1\tlinux-image-6.12.1+deb12-amd64-unsigned\towned\t5\t0\t0\t300\t.\t-\t2026-11-26\tabc1234\t0\n" +
		"5.10\t5.10.0-46-amd64\tlinux-image-5.10.0-46-amd64-unsigned\tverify-and-repair\t5\t0\t1\t300\t.\t-\t2026-11-25\tabc1234\t-\n"
	table, err = Table(sub)
	if err != nil {
		t.Fatal(err)
	}
	lines = strings.Split(strings.TrimSpace(table), "\n")
	if len(lines) != 5 || !strings.Contains(lines[2], "| 5 | 0 | 1 | ") || !strings.Contains(lines[3], "| 5 | 0 | 0 (subtests 2) | ") ||
		!strings.Contains(lines[4], "| 5 | 0 | 0 | ") {
		t.Errorf("table with subtests skipped:\n%s", table)
	}
	if _, err := Table("series\tkernel\n6.1\t6.1.0\n"); err == nil {
		t.Errorf("a tsv without the mode column was taken")
	}
}

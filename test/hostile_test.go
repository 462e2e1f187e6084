package test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/internal/testnet"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// hostileGood is the config in force before and after every hostile one.
const hostileGood = "resyncInterval: 1h\nnonMasqueradeCIDRs: [203.0.113.0/24]\n"

// hostileCase is one malformed or hostile config. Either the agent refuses
// it with a one-line error holding every string of want, and the kernel
// keeps the previous rules; or (accept != "") the README (or YAML itself)
// says it is accepted, and the agent applies what the config accept
// describes, logging a warning holding every string of warn.
type hostileCase struct {
	name   string
	data   func() []byte      // the file's content
	place  func(string) error // instead of data: put something at this path
	want   []string           // refused: the error line holds these
	accept string             // accepted: the equivalent plain config
	warn   []string           // accepted: a warning holds these
	soak   bool               // only with SOAK=1 (large and slow)
}

func text(s string) func() []byte { return func() []byte { return []byte(s) } }

// repeated returns head, n times item joined by sep, and tail.
func repeated(head, item, sep, tail string, n int) func() []byte {
	return func() []byte {
		var b bytes.Buffer
		b.Grow(len(head) + n*(len(item)+len(sep)) + len(tail))
		b.WriteString(head)
		for i := range n {
			if i > 0 {
				b.WriteString(sep)
			}
			b.WriteString(item)
		}
		b.WriteString(tail)
		return b.Bytes()
	}
}

// cidrList returns n distinct /24s in 1.0.0.0-100.0.0.0 as a YAML block list.
func cidrList(head string, n int) func() []byte {
	return func() []byte {
		var b bytes.Buffer
		b.WriteString(head)
		for i := range n {
			b.WriteString(cidrLine(i))
		}
		return b.Bytes()
	}
}

func cidrLine(i int) string { return fmt.Sprintf("- %d.%d.%d.0/24\n", 1+i>>16, i>>8&255, i&255) }

// cidrsFitting is how many lines of cidrList fit after head in size bytes.
func cidrsFitting(head string, size int) int {
	size -= len(head)
	n := 0
	for l := len(cidrLine(n)); size >= l; l = len(cidrLine(n)) {
		size -= l
		n++
	}
	return n
}

func garbage(n int) func() []byte {
	return func() []byte {
		b := make([]byte, n)
		r := rand.NewChaCha8([32]byte{1})
		r.Read(b)
		return b
	}
}

func hostileCases() []hostileCase {
	const listHead = "nonMasqueradeCIDRs:\n"
	maxCIDRs := cidrsFitting(listHead, config.MaxFileSize)
	const mib = 1 << 20
	nest := func(open, close string, n int) func() []byte {
		return text("nonMasqueradeCIDRs: " + strings.Repeat(open, n) + strings.Repeat(close, n) + "\n")
	}
	return []hostileCase{
		// Garbage and size.
		{name: "10 MB of binary garbage", data: garbage(10 * mib), want: []string{"file is larger than the limit"}},
		{name: "3 MB of binary garbage", data: garbage(3 * mib), want: []string{"cannot parse YAML/JSON"}},
		{name: "NUL bytes", data: text("nonMasqueradeCIDRs: [10.0.0.0/8]\x00\x00\x00\n"), want: []string{"cannot parse YAML/JSON"}},
		{name: "invalid UTF-8", data: text("nonMasqueradeCIDRs: [\"\xff\xfe10.0.0.0/8\"]\n"), want: []string{"cannot parse YAML/JSON"}},
		{name: "3 MB comment before a good config", data: func() []byte {
			return append(append([]byte("# "), bytes.Repeat([]byte("x"), 3*mib)...), "\n"+hostileGood...)
		}, accept: hostileGood},
		{name: "3 MB CIDR string", data: repeated(`nonMasqueradeCIDRs: ["`, "1", "", "\"]\n", 3*mib),
			want: []string{"nonMasqueradeCIDRs[0]", "is not a valid CIDR"}},
		{name: "10 MB CIDR string", data: repeated(`nonMasqueradeCIDRs: ["`, "1", "", "\"]\n", 10*mib),
			want: []string{"file is larger than the limit"}},
		{name: "one byte over the size limit", data: repeated("# ", "x", "", "\n", config.MaxFileSize),
			want: []string{"file is larger than the limit of 4194304 bytes"}},
		{name: "symlink to /dev/zero", place: func(p string) error { return os.Symlink("/dev/zero", p) },
			want: []string{"is not a regular file"}},
		{name: "dangling symlink (the key was removed): defaults", place: func(p string) error { return os.Symlink("gone", p) },
			accept: ""},
		{name: "empty file: defaults", data: text(""), accept: ""},
		// A tab in an otherwise blank file is a YAML error for the original too (config/parity_test.go).
		{name: "byte order mark and blanks with a tab: refused, as by the original", data: text("\xef\xbb\xbf \n\t\n"), want: []string{"cannot parse YAML/JSON"}},
		{name: "byte order mark and blanks: defaults", data: text("\xef\xbb\xbf \n \n"), accept: ""},
		{name: "CRLF line ends", data: text(strings.ReplaceAll(hostileGood, "\n", "\r\n")), accept: hostileGood},

		// Structure.
		{name: "deeply nested YAML lists", data: nest("[", "]", 100_000), want: []string{"exceeded max depth"}},
		{name: "deeply nested JSON", data: func() []byte {
			return []byte(`{"nonMasqueradeCIDRs": ` + strings.Repeat("[", 100_000) + strings.Repeat("]", 100_000) + "}")
		}, want: []string{"exceeded max depth"}},
		{name: "nested mappings within the depth limit: unknown key", data: func() []byte {
			return []byte("a: " + strings.Repeat("{a: ", 9000) + "1" + strings.Repeat("}", 9000) + "\n" + hostileGood)
		}, accept: hostileGood, warn: []string{`unknown key \"a\" ignored`}},
		{name: "YAML alias bomb", data: func() []byte {
			var b strings.Builder
			b.WriteString(`a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]` + "\n")
			for c := 'b'; c <= 'i'; c++ {
				p := string(c - 1)
				fmt.Fprintf(&b, "%c: &%c [*%s,*%s,*%s,*%s,*%s,*%s,*%s,*%s,*%s]\n", c, c, p, p, p, p, p, p, p, p, p)
			}
			b.WriteString("nonMasqueradeCIDRs: *i\n")
			return []byte(b.String())
		}, want: []string{"excessive aliasing"}},
		{name: "YAML alias bomb of 4^24 mappings", data: func() []byte {
			var b strings.Builder
			b.WriteString("a0: &a0 {x: 1}\n")
			for i := 1; i <= 24; i++ {
				fmt.Fprintf(&b, "a%d: &a%d [*a%d, *a%d, *a%d, *a%d]\n", i, i, i-1, i-1, i-1, i-1)
			}
			b.WriteString("nonMasqueradeCIDRs: *a24\n")
			return []byte(b.String())
		}, want: []string{"excessive aliasing"}},
		{name: "small alias use", data: text("resyncInterval: 1h\nnonMasqueradeCIDRs: &n [203.0.113.0/24]\nmasqueradeCIDRs: *n\n"),
			accept: "resyncInterval: 1h\nnonMasqueradeCIDRs: [203.0.113.0/24]\nmasqueradeCIDRs: [203.0.113.0/24]\n"},
		// Repeated keys: the last one read wins, as in the original agent
		// (for YAML, of two spellings the one that sorts last).
		{name: "duplicate keys (YAML)", data: text(hostileGood + "nonMasqueradeCIDRs: [198.51.100.0/24]\n"),
			accept: "resyncInterval: 1h\nnonMasqueradeCIDRs: [198.51.100.0/24]\n", warn: []string{"given more than once"}},
		{name: "duplicate keys (JSON)", data: text(`{"resyncInterval": "1h", "masqLinkLocal": false, "masqLinkLocal": true}`),
			accept: "resyncInterval: 1h\nmasqLinkLocal: true\n", warn: []string{"given more than once"}},
		{name: "keys differing only in case", data: text("resyncInterval: 1h\nmasqLinkLocal: true\nMasqLinkLocal: false\n"),
			accept: "resyncInterval: 1h\nmasqLinkLocal: true\n", warn: []string{"given more than once"}},
		{name: "the document is a list", data: text("- 10.0.0.0/8\n"), want: []string{"must be a mapping"}},
		{name: "the document is a scalar", data: text("10.0.0.0/8\n"), want: []string{"must be a mapping"}},
		{name: "complex mapping key", data: text("? [a, b]\n: c\n"), want: []string{"invalid map key"}},
		{name: "tab indentation", data: text("\tnonMasqueradeCIDRs: [10.0.0.0/8]\n"), want: []string{"cannot parse YAML/JSON"}},

		// Types.
		{name: "list given as a string", data: text("nonMasqueradeCIDRs: 10.0.0.0/8\n"), want: []string{"expected a list of CIDRs"}},
		{name: "list of mixed types", data: text("nonMasqueradeCIDRs: [10.0.0.0/8, [1], {a: 1}, 5, true]\n"),
			want: []string{"nonMasqueradeCIDRs[1]", "nonMasqueradeCIDRs[4]", "expected a CIDR string"}},
		{name: "bool given as a quoted string", data: text("masqLinkLocal: \"true\"\n"), want: []string{"masqLinkLocal", "expected true or false"}},
		{name: "YAML 1.1 boolean yes", data: text(hostileGood + "masqLinkLocal: yes\n"),
			accept: hostileGood + "masqLinkLocal: true\n"},
		{name: "!!binary tag", data: text("nonMasqueradeCIDRs: !!binary aGVsbG8=\n"), want: []string{"expected a list of CIDRs"}},
		{name: "!!python/object tag", data: text("masqLinkLocal: !!python/object/apply:os.system [\"true\"]\n"),
			want: []string{"masqLinkLocal", "expected true or false"}},
		{name: "a null list is empty", data: text("resyncInterval: 1h\nnonMasqueradeCIDRs: null\n"),
			accept: "resyncInterval: 1h\nnonMasqueradeCIDRs: []\n", warn: []string{"null means an empty list"}},

		// Durations and numbers.
		{name: "duration as a number", data: text("resyncInterval: 60\n"), want: []string{"resyncInterval", "expected a duration string"}},
		{name: "negative duration: raised to 1s", data: text("resyncInterval: -1s\nnonMasqueradeCIDRs: [203.0.113.0/24]\n"),
			accept: "resyncInterval: 1s\nnonMasqueradeCIDRs: [203.0.113.0/24]\n", warn: []string{"is not positive; using 1s"}},
		{name: "zero duration: raised to 1s", data: text("resyncInterval: 0s\nnonMasqueradeCIDRs: [203.0.113.0/24]\n"),
			accept: "resyncInterval: 1s\nnonMasqueradeCIDRs: [203.0.113.0/24]\n", warn: []string{"is not positive; using 1s"}},
		{name: "huge duration", data: text("resyncInterval: 9999999999h\n"), want: []string{"resyncInterval", "not a valid duration"}},
		{name: "one-nanosecond duration: raised to 1s", data: text("resyncInterval: 1ns\nnonMasqueradeCIDRs: [203.0.113.0/24]\n"),
			accept: "resyncInterval: 1s\nnonMasqueradeCIDRs: [203.0.113.0/24]\n", warn: []string{"below the minimum of 1s"}},
		{name: "cidrLimit zero", data: text("cidrLimit: 0\n"), want: []string{"exceed cidrLimit 0"}},
		{name: "cidrLimit negative", data: text("cidrLimit: -1\n"), want: []string{"exceed cidrLimit -1"}},
		{name: "cidrLimit past int64", data: text("cidrLimit: 9223372036854775808\n"), want: []string{"cidrLimit", "out of range"}},
		{name: "cidrLimit 1e400", data: text(`{"cidrLimit": 1e400}`), want: []string{"cidrLimit", "not an integer"}},
		{name: "cidrLimit fractional", data: text("cidrLimit: 64.5\n"), want: []string{"cidrLimit", "not an integer"}},

		// CIDRs.
		{name: "CIDR with surrounding spaces", data: text(`nonMasqueradeCIDRs: [" 10.0.0.0/8 "]` + "\n"), want: []string{"remove the surrounding spaces"}},
		{name: "CIDR with an inner space", data: text(`nonMasqueradeCIDRs: ["10.0.0.0 /8"]` + "\n"), want: []string{`10.0.0.0 /8\" is not a valid CIDR`}},
		{name: "leading zeros", data: text("nonMasqueradeCIDRs: [010.000.000.000/8]\n"), want: []string{"010.000.000.000/8", "is not a valid CIDR"}},
		{name: "leading zero in the prefix length: octal, as the original's iptables-restore read it", data: text(`{"resyncInterval": "1h", "nonMasqueradeCIDRs": ["203.0.113.0/030"]}`),
			accept: hostileGood, warn: []string{"leading zero in its prefix length", `read as octal: \"203.0.113.0/24\"`}},
		{name: "leading zero in the prefix length, no octal number", data: text(`{"resyncInterval": "1h", "nonMasqueradeCIDRs": ["203.0.113.0/024", "10.0.0.0/08"]}`),
			want: []string{`\"10.0.0.0/08\" has a leading zero in its prefix length, which iptables reads as an octal number`}},
		{name: "IPv6 zone", data: text(`nonMasqueradeCIDRs: ["fe80::1%eth0/64"]` + "\n"), want: []string{"zones"}},
		{name: "IPv6 without --enable-ipv6", data: text(`nonMasqueradeCIDRs: ["fd00::/8"]` + "\n"), want: []string{"--enable-ipv6"}},
		{name: "IPv4-mapped IPv6: read as IPv4", data: text("resyncInterval: 1h\nnonMasqueradeCIDRs: [\"::ffff:203.0.113.0/120\"]\n"),
			accept: hostileGood, warn: []string{"IPv4-mapped IPv6 CIDR", `read as \"203.0.113.0/24\"`}},
		{name: "host bits set", data: text("nonMasqueradeCIDRs: [10.0.0.1/8]\n"), want: []string{`did you mean \"10.0.0.0/8\"`}},
		{name: "prefix length 33", data: text("nonMasqueradeCIDRs: [10.0.0.0/33]\n"), want: []string{"10.0.0.0/33"}},
		{name: "address without a length", data: text("nonMasqueradeCIDRs: [10.1.2.3]\n"), want: []string{"missing the prefix length"}},
		{name: "full-width digits", data: text("nonMasqueradeCIDRs: [\"１０.0.0.0/8\"]\n"), want: []string{"is not a valid CIDR"}},
		{name: "NUL inside a CIDR", data: text(`{"nonMasqueradeCIDRs": ["10.0.0.0/8\u0000"]}`), want: []string{"is not a valid CIDR"}},

		// Many entries.
		{name: "a million-entry list (2 MB)", data: repeated("nonMasqueradeCIDRs: [", "0", ",", "]\n", 1_000_000),
			want: []string{"nonMasqueradeCIDRs[0]", "more errors"}},
		{name: "a ConfigMap's worth (1 MiB) of valid CIDRs past cidrLimit", data: cidrList("nonMasqueradeCIDRs:\n", 60_000),
			want: []string{"60000 CIDRs exceed cidrLimit 64"}},
		{name: "100,000 unknown keys", data: func() []byte {
			var b bytes.Buffer
			b.WriteString(hostileGood)
			for i := range 100_000 {
				fmt.Fprintf(&b, "k%d: 1\n", i)
			}
			return b.Bytes()
		}, accept: hostileGood, warn: []string{"and 99980 more warnings"}},
		{name: "a 1 MB key (YAML: implicit keys are limited)", data: func() []byte { return []byte(hostileGood + strings.Repeat("k", mib) + ": 1\n") },
			want: []string{"cannot parse YAML/JSON"}},
		{name: "a 1 MB key (JSON)", data: func() []byte {
			return []byte(`{"resyncInterval": "1h", "nonMasqueradeCIDRs": ["203.0.113.0/24"], "` + strings.Repeat("k", mib) + `": 1}`)
		}, accept: hostileGood, warn: []string{`kkk\"... ignored`}},
		{name: "unknown keys and a typo", data: text(hostileGood + "masqueradeCIDR: [0.0.0.0/0]\nfoo: bar\n"),
			accept: hostileGood, warn: []string{`did you mean \"masqueradeCIDRs\"`}},

		// Only with SOAK=1: the largest inputs the size limit lets through.
		{name: "8 million entries (4 MiB)", data: repeated("nonMasqueradeCIDRs: [", "0", ",", "]\n", config.MaxFileSize/2-16),
			want: []string{"more errors"}, soak: true},
		// As many valid CIDRs as the size limit lets through (a million
		// once, when the limit was 16 MiB).
		{name: "the most valid CIDRs the size limit lets through, past cidrLimit", data: cidrList(listHead, maxCIDRs),
			want: []string{fmt.Sprintf("%d CIDRs exceed cidrLimit 64", maxCIDRs)}, soak: true},
		{name: "5 million empty lists (4 MiB)", data: repeated("nonMasqueradeCIDRs: [", "[]", ",", "]\n", config.MaxFileSize/3-16),
			want: []string{"more errors"}, soak: true},
	}
}

var outcomeRE = regexp.MustCompile(`msg="(config not applied|config file not applied|applied config|applied new config|resync:|sync failed)`)

// TestHostileConfigs feeds the daemon, through the kubelet's ConfigMap
// layout, more than 40 malformed and hostile configs, one after the other,
// each after the good config is back in force. Each is refused with a
// one-line error naming the problem while the kernel keeps the good rules
// exactly, or accepted as the README documents; the agent stays up, and
// its peak memory stays within a bound linear in the largest input (the
// file size limit bounds it). The largest inputs run with SOAK=1.
func TestHostileConfigs(t *testing.T) {
	topo := newTopology(t)
	cm := newConfigMapDir(t, hostileGood)
	d := startDaemon(t, topo, "--config", cm.path())
	pid := d.Cmd.Process.Pid
	waitOutcome(t, d, 0, "the good config")
	good := withoutCounters(listTable(t, topo))
	goodSets := kernelSets(t, topo)

	refused, accepted, largest, overLimit := 0, 0, 0, 0
	limitKB := int(daemonSetMemoryLimitBytes(t) >> 10)
	var peakKB, growthKB int
	var peakCase, growthCase string
	start := time.Now()
	for _, tc := range hostileCases() {
		if tc.soak && !soakMode() {
			continue
		}
		ok := t.Run(tc.name, func(t *testing.T) {
			size := config.MaxFileSize // what the agent may read through a special file
			var data []byte
			if tc.data != nil {
				data = tc.data()
				size = len(data)
			}
			largest = max(largest, size)
			// The peak RSS of this case: VmHWM reset to the current RSS
			// before, read after. The Go runtime keeps freed memory for a
			// while, so the growth is what this case took beyond it.
			resetPeakRSS(t, pid)
			before := procStatusKB(t, pid, "VmRSS")
			mark := len(d.output())
			if tc.place != nil {
				cm.place(tc.place)
			} else {
				cm.update(string(data))
			}
			lines := waitOutcome(t, d, mark, tc.name)
			logged := d.output()[mark:]
			alive(t, d)
			hwm := procStatusKB(t, pid, "VmHWM")
			if hwm > peakKB {
				peakKB, peakCase = hwm, tc.name
			}
			if hwm > limitKB {
				overLimit++
			}
			// Bounded by the input: 64 MiB plus 320 bytes per byte
			// (measured: up to ~230 for a list of one-character items).
			growth := hwm - before
			if growth > growthKB {
				growthKB, growthCase = growth, tc.name
			}
			if bound := 64<<10 + 320*min(size, config.MaxFileSize+1)>>10; growth > bound {
				t.Errorf("the agent's RSS grew by %d KiB (to %d KiB), more than the bound %d KiB (64 MiB + 320 x the input's %d bytes)",
					growth, hwm, bound, size)
			}
			for _, l := range strings.Split(strings.TrimSpace(logged), "\n") {
				if len(l) > 16<<10 {
					t.Errorf("a log line of %d bytes: messages must stay short: %.200s...", len(l), l)
				}
			}
			if tc.want != nil {
				refused++
				errLine := lineWith(lines, "config not applied")
				if errLine == "" {
					t.Fatalf("not refused; the agent logged:\n%.2000s", logged)
				}
				for _, w := range tc.want {
					if !strings.Contains(errLine, w) {
						t.Errorf("the error does not say %q:\n%.1000s", w, errLine)
					}
				}
				if got := withoutCounters(listTable(t, topo)); got != good {
					t.Errorf("the rules changed after a refused config:\n%s", got)
				}
			} else {
				accepted++
				if lineWith(lines, "config not applied") != "" {
					t.Fatalf("refused, but documented as accepted:\n%.2000s", lines)
				}
				for _, w := range tc.warn {
					if !strings.Contains(lineWithAll(logged, "level=WARN", w), w) {
						t.Errorf("no warning saying %q in:\n%.2000s", w, logged)
					}
				}
				wantSets := expectedSets(t, tc.accept)
				if got := kernelSets(t, topo); !equalSets(got, wantSets) {
					t.Errorf("applied sets %v, want %v (as %q)", got, wantSets, tc.accept)
				}
			}
			// Back to the good config (and a quiet daemon: no backoff pending).
			mark = len(d.output())
			cm.update(hostileGood)
			waitOutcome(t, d, mark, "the good config again")
			if got := kernelSets(t, topo); !equalSets(got, goodSets) {
				t.Fatalf("the good config did not come back: sets %v", got)
			}
		})
		if !ok && !alive(t, d) {
			break
		}
	}
	if got := withoutCounters(listTable(t, topo)); got != good {
		t.Errorf("the table at the end differs from the good config's:\n%s", got)
	}
	addDestinations(t, topo, internet1, private1)
	expectSources(t, topo, map[string]bool{internet1: false, private1: true})
	code, body := httpGet(topo, "/healthz")
	if code != 200 {
		t.Errorf("/healthz after the hostile configs: %d %s", code, body)
	}
	t.Logf("%d hostile configs in %s: %d refused with a one-line error (rules unchanged each time), %d accepted as documented; "+
		"the agent stayed up; largest input %.1f MiB; largest RSS growth of one case %.1f MiB (%q); peak RSS %.1f MiB (%q); "+
		"%d cases peaked over the DaemonSet's %d MiB memory limit",
		refused+accepted, time.Since(start).Round(time.Millisecond), refused, accepted, float64(largest)/(1<<20),
		float64(growthKB)/1024, growthCase, float64(peakKB)/1024, peakCase, overLimit, limitKB>>10)
	if refused+accepted < 40 && !t.Failed() {
		t.Errorf("only %d cases ran, want at least 40", refused+accepted)
	}
}

// TestHostileConfigIgnoredContent: content that the YAML library drops
// silently must not be dropped silently: a second YAML document, or text
// after a flow mapping, makes the config not what the operator wrote.
func TestHostileConfigIgnoredContent(t *testing.T) {
	for _, tc := range []struct{ name, data, warn, err string }{
		// Read as the original read it (the first document), with a
		// warning that names what is ignored.
		{"second YAML document", "nonMasqueradeCIDRs: [10.0.0.0/8]\n---\nnonMasqueradeCIDRs: [0.0.0.0/0]\n",
			`content after the first YAML document (after a "---" or "..." line) is ignored`, ""},
		{"text after a flow mapping", `{"nonMasqueradeCIDRs": ["10.0.0.0/8"]} {"nonMasqueradeCIDRs": ["0.0.0.0/0"]}`,
			"", "invalid character '{' after top-level value"},
	} {
		c, warns, err := config.Parse([]byte(tc.data), config.Flags{})
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: error %v, want one saying %q (config %v, warnings %q)", tc.name, err, tc.err, c.NonMasqueradeCIDRs, warns)
			}
		case err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case len(warns) != 1 || !strings.Contains(warns[0], tc.warn):
			t.Errorf("%s: warnings %q, want one saying %q", tc.name, warns, tc.warn)
		case fmt.Sprint(c.NonMasqueradeCIDRs) != "[10.0.0.0/8]":
			t.Errorf("%s: nonMasqueradeCIDRs %v, want the first document's [10.0.0.0/8]", tc.name, c.NonMasqueradeCIDRs)
		}
	}
}

// TestHostileConfigFIFO: a FIFO at the config path must not hang the agent
// (os.Open of a FIFO blocks until a writer comes): the next good config
// must still be applied.
func TestHostileConfigFIFO(t *testing.T) {
	topo := newTopology(t)
	addDestinations(t, topo, internet1, private1)
	cm := newConfigMapDir(t, hostileGood)
	d := startDaemon(t, topo, "--config", cm.path(), "--http-address=127.0.0.1:0")
	waitOutcome(t, d, 0, "the good config")
	mark := len(d.output())
	cm.place(func(p string) error { return syscall.Mkfifo(p, 0o644) })
	// The agent opened the FIFO, did not block in it, and said so.
	if lines := waitOutcome(t, d, mark, "the FIFO"); !strings.Contains(lines, "is not a regular file") {
		t.Fatalf("the FIFO was not refused as not a regular file:\n%s", lines)
	}
	cm.update("resyncInterval: 1h\nnonMasqueradeCIDRs: [10.0.0.0/8]\n")
	eventually(t, "the config after the FIFO", sourcesAre(topo, map[string]bool{internet1: true, private1: false}))
	t.Logf("after the FIFO:\n%s", d.output()[mark:])
}

// TestHostileConfigMemoryFitsDaemonSet: the largest config a ConfigMap can
// hold (1 MiB) must parse within the DaemonSet's memory limit, or anyone
// who may edit the ConfigMap can have the agent OOM-killed in a loop.
func TestHostileConfigMemoryFitsDaemonSet(t *testing.T) {
	topo := newTopology(t)
	limit := daemonSetMemoryLimitBytes(t)
	path := writeConfig(t, string(repeated("nonMasqueradeCIDRs: [", "0", ",", "]\n", (1<<20-32)/2)()))
	cmd := nodeCommand(topo, agentBin, "--once", "--config", path)
	out, _ := cmd.CombinedOutput()
	ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if !ok {
		t.Fatal("no rusage")
	}
	peak := ru.Maxrss << 10
	t.Logf("1 MiB config: peak RSS %.1f MiB, the DaemonSet's limit %.0f MiB\n%.300s", float64(peak)/(1<<20), float64(limit)/(1<<20), out)
	if peak > limit*3/4 {
		t.Errorf("peak RSS %d bytes is more than 3/4 of the DaemonSet's memory limit (%d bytes)", peak, limit)
	}
}

// waitOutcome waits (at most 60 s) until the daemon logs the outcome of a
// sync after byte mark of its log, and returns the log lines after mark.
func waitOutcome(t *testing.T, d *daemon, mark int, what string) string {
	t.Helper()
	var after string
	if err := d.Wait(context.Background(), 60*time.Second, "sync outcome logged for "+what, func(log string) bool {
		after = log[min(mark, len(log)):]
		return outcomeRE.MatchString(after)
	}); err != nil {
		t.Fatalf("%v\nafter the mark:\n%.3000s", err, after)
	}
	return after
}

// alive reports whether the daemon still runs, and fails the test if not.
func alive(t *testing.T, d *daemon) bool {
	t.Helper()
	select {
	case <-d.Exited():
		t.Errorf("the agent exited: %v", d.Err())
		return false
	default:
		return true
	}
}

// resetPeakRSS resets the process's VmHWM to its current RSS.
func resetPeakRSS(t *testing.T, pid int) {
	t.Helper()
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0o200); err != nil {
		t.Fatalf("reset the agent's peak RSS: %v", err)
	}
}

// procStatusKB reads a "kB" field of /proc/PID/status.
func procStatusKB(t *testing.T, pid int, field string) int {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("read the agent's status: %v", err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			n, _ := strconv.Atoi(strings.Fields(v)[0])
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

func lineWithAll(s string, substrs ...string) string {
	for _, l := range strings.Split(s, "\n") {
		all := true
		for _, sub := range substrs {
			all = all && strings.Contains(l, sub)
		}
		if all {
			return l
		}
	}
	return ""
}

// kernelSets returns the elements of the agent's IPv4 sets as nft lists
// them, as prefixes ("/32" added to bare addresses), by set name.
func kernelSets(t *testing.T, topo *testnet.Topology) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, name := range []string{nft.SetMasqV4, nft.SetNonMasqV4} {
		s, err := topo.NFT("list", "set", "inet", nft.TableName, name)
		if err != nil {
			t.Fatalf("nft list set %s: %v\n%s", name, err, s)
		}
		out[name] = parseElements(s)
	}
	return out
}

// parseElements returns the elements of an `nft list set` output.
func parseElements(s string) []string {
	i := strings.Index(s, "elements = {")
	if i < 0 {
		return []string{}
	}
	s = s[i+len("elements = {"):]
	s = s[:strings.Index(s, "}")]
	var out []string
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\t' }) {
		if !strings.Contains(f, "/") {
			if a, err := netip.ParseAddr(f); err == nil {
				f = netip.PrefixFrom(a, a.BitLen()).String()
			}
		}
		out = append(out, f)
	}
	slices.Sort(out)
	return out
}

// expectedSets returns what kernelSets should read after applying cfg.
func expectedSets(t *testing.T, cfg string) map[string][]string {
	t.Helper()
	c, _, err := config.Parse([]byte(cfg), config.Flags{})
	if err != nil {
		t.Fatalf("the equivalent config %q: %v", cfg, err)
	}
	rs := nft.Build(c, nft.Options{Chain: nft.DefaultChain, RandomFully: true})
	out := map[string][]string{}
	for _, s := range rs.Sets {
		if s.Key.Family() != 4 {
			continue
		}
		l := []string{}
		for _, r := range s.Elements {
			if p, ok := r.Prefix(); ok {
				l = append(l, p.String())
			} else {
				l = append(l, r.String()) // a merged range, as nft lists it: first-last
			}
		}
		slices.Sort(l)
		out[s.Name] = l
	}
	return out
}

func equalSets(a, b map[string][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

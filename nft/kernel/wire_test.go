package kernel

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/ip-masq-agent/ip-masq-agent-nft/config"
	"github.com/ip-masq-agent/ip-masq-agent-nft/nft"
)

// The wire format, tested without root against recorded bytes (as
// google/nftables and tailscale do): what the agent sends for a table, and
// what a kernel answered when that table was read back. `go test
// ./nft/kernel -run Wire -record` (root) records both again, the answers
// from the kernel it runs on.
var record = flag.Bool("record", false, "record testdata/wire-*.hex again (the kernel's answers need root)")

// wireTable has every kind of set, rule and statement the agent writes.
func wireTable(t *testing.T) nft.Table {
	cfg, _, err := config.Parse([]byte("nonMasqueradeCIDRs: [10.0.0.0/8, 192.168.0.0/16, fd00::/8]\nmasqueradeCIDRs: [10.1.0.0/16, 2001:db8::/32]\nmasqLinkLocal: true\n"), config.Flags{EnableIPv6: true})
	if err != nil {
		t.Fatal(err)
	}
	label := uint8(20)
	return nft.Build(cfg, nft.Options{Chain: nft.DefaultChain, EnableIPv6: true, RandomFully: true, CtLabel: &label,
		ToPorts: []nft.PortRange{{First: 1024, Last: 65535}}})
}

// createBatch is the transaction that creates wireTable, its set ids 0
// (clearSetIDs).
func createBatch(t *testing.T) *batch {
	t.Helper()
	p, err := nft.PlanFor(nil, wireTable(t))
	if err != nil {
		t.Fatal(err)
	}
	b, err := encode(p)
	if err != nil {
		t.Fatal(err)
	}
	clearSetIDs(b.msgs)
	return b
}

// clearSetIDs writes the transaction-local ids of new sets as 0: they come
// from a counter of google/nftables that every test in the process moves.
// No message of the agent's refers to a set by id.
func clearSetIDs(msgs []netlink.Message) {
	for _, m := range msgs {
		if m.Header.Type == netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWSET) {
			walkAttrs(m.Data[4:], func(typ uint16, v []byte) bool {
				if typ == unix.NFTA_SET_ID {
					clear(v)
				}
				return true
			})
		}
	}
}

// writeHex writes messages as sections of "type flags data" lines.
func writeHex(sections map[string][]netlink.Message, order []string) []byte {
	var b bytes.Buffer
	for _, name := range order {
		fmt.Fprintf(&b, "# %s\n", name)
		for _, m := range sections[name] {
			fmt.Fprintf(&b, "%04x %04x %s\n", uint16(m.Header.Type), uint16(m.Header.Flags), hex.EncodeToString(m.Data))
		}
	}
	return b.Bytes()
}

func readHex(t *testing.T, path string) map[string][]netlink.Message {
	t.Helper()
	out := map[string][]netlink.Message{}
	scanHex(t, path, func(section, line string) {
		var typ, flags uint16
		var data string
		if _, err := fmt.Sscanf(line, "%04x %04x %s", &typ, &flags, &data); err != nil {
			t.Fatalf("%s: %q: %v", path, line, err)
		}
		d, err := hex.DecodeString(data)
		if err != nil {
			t.Fatal(err)
		}
		out[section] = append(out[section], netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(typ), Flags: netlink.HeaderFlags(flags)}, Data: d})
	})
	return out
}

// scanHex calls f with every line of a testdata/wire-*.hex file but its
// "# section" lines, and the section the line is in.
func scanHex(t *testing.T, path string, f func(section, line string)) {
	t.Helper()
	file, err := os.Open(path)
	if err != nil {
		t.Fatalf("%v (record it: go test ./nft/kernel -run Wire -record, as root)", err)
	}
	defer file.Close()
	section := ""
	sc := bufio.NewScanner(file)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if name, ok := strings.CutPrefix(line, "# "); ok {
			section = name
			continue
		}
		f(section, line)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
}

// TestWireSend: the transaction that creates the table is, byte for
// byte, the recorded one (a change to the encoding shows as a diff here,
// to be recorded again on purpose).
func TestWireSend(t *testing.T) {
	b := createBatch(t)
	got := writeHex(map[string][]netlink.Message{"create": b.msgs}, []string{"create"})
	const path = "testdata/wire-send.hex"
	if *record {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (record it: go test ./nft/kernel -run WireSend -record)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("the create transaction differs from %s:\n got %s\nwant %s", path, got, want)
	}
}

// TestWireRead: a kernel's dumps of the table (its rules, its sets'
// elements), recorded, decode as the table the agent wrote.
func TestWireRead(t *testing.T) {
	want := wireTable(t)
	const path = "testdata/wire-read.hex"
	if *record {
		n, _ := kernelNetlink(t)
		n.NoOwner = true
		if _, err := nft.Ensure(n, want); err != nil {
			t.Fatal(err)
		}
		conn, err := n.reader()
		if err != nil {
			t.Fatal(err)
		}
		sections := map[string][]netlink.Message{}
		order := []string{"rules"}
		if sections["rules"], err = dump(unix.NFT_MSG_GETRULE, attr(unix.NFTA_RULE_TABLE, cstring(nft.TableName))).ask(conn); err != nil {
			t.Fatal(err)
		}
		for _, s := range want.Sets {
			if sections["set "+s.Name], err = dump(unix.NFT_MSG_GETSETELEM,
				attr(unix.NFTA_SET_ELEM_LIST_TABLE, cstring(nft.TableName)), attr(unix.NFTA_SET_ELEM_LIST_SET, cstring(s.Name))).ask(conn); err != nil {
				t.Fatal(err)
			}
			order = append(order, "set "+s.Name)
		}
		if err := os.WriteFile(path, writeHex(sections, order), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	dumps := readHex(t, path)
	rules, err := decodeRules(dumps["rules"])
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range want.Chains {
		got := rules[c.Name]
		if len(got) != len(c.Rules) {
			t.Fatalf("chain %s: %d rules read, want %d", c.Name, len(got), len(c.Rules))
		}
		for i, r := range c.Rules {
			if got[i].Foreign != "" || nft.RenderRule(got[i]) != nft.RenderRule(r) {
				t.Errorf("chain %s rule %d: read %q (foreign %q), want %q", c.Name, i+1, nft.RenderRule(got[i]), got[i].Foreign, nft.RenderRule(r))
			}
		}
	}
	for _, s := range want.Sets {
		found := nft.Set{Name: s.Name}
		odd, err := decodeElements(dumps["set "+s.Name], &found)
		if err != nil || len(odd) > 0 || fmt.Sprint(found.Elements) != fmt.Sprint(s.Elements) {
			t.Errorf("set %s: read %v (odd %q, %v), want %v", s.Name, found.Elements, odd, err, s.Elements)
		}
	}
}

package nft

import (
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// Render returns the ruleset as `nft -f` input, in the layout of
// `nft list table inet ip-masq-agent` (without counters' values). It is used
// for golden tests, debug logs and comparison with what the kernel holds.
func Render(rs Ruleset) string {
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s {\n", TableName)
	for _, s := range rs.Sets {
		typ := "ipv4_addr"
		if s.Family == 6 {
			typ = "ipv6_addr"
		}
		fmt.Fprintf(&b, "\tset %s {\n\t\ttype %s\n\t\tflags interval\n", s.Name, typ)
		if s.Comment != "" {
			fmt.Fprintf(&b, "\t\tcomment %q\n", s.Comment)
		}
		if len(s.Prefixes) > 0 {
			elems := make([]string, len(s.Prefixes))
			for i, p := range s.Prefixes {
				elems[i] = p.String()
				if p.IsSingleIP() {
					elems[i] = p.Addr().String()
				}
			}
			fmt.Fprintf(&b, "\t\telements = { %s }\n", strings.Join(elems, ", "))
		}
		b.WriteString("\t}\n\n")
	}
	chain := func(name, hook string, rules []Rule) {
		fmt.Fprintf(&b, "\tchain %s {\n", name)
		if hook != "" {
			fmt.Fprintf(&b, "\t\t%s\n", hook)
		}
		for _, r := range rules {
			fmt.Fprintf(&b, "\t\t%s\n", RenderRule(r))
		}
		b.WriteString("\t}\n")
	}
	chain(BaseChainName, fmt.Sprintf("type nat hook postrouting priority srcnat + %d; policy accept;", Priority-100), rs.Base)
	b.WriteString("\n")
	chain(rs.Chain, "", rs.Rules)
	b.WriteString("\n")
	chain(MasqChainName, "", rs.Masq)
	b.WriteString("}\n")
	return b.String()
}

// RenderRule returns one rule in nft syntax.
func RenderRule(r Rule) string {
	var w []string
	if r.NotLocal {
		w = append(w, "fib daddr type != local")
	}
	switch {
	case r.DaddrSet != "" && r.Family == 6:
		w = append(w, "ip6 daddr @"+r.DaddrSet)
	case r.DaddrSet != "":
		w = append(w, "ip daddr @"+r.DaddrSet)
	case r.Family == 4:
		w = append(w, "meta nfproto ipv4")
	case r.Family == 6:
		w = append(w, "meta nfproto ipv6")
	}
	if r.L4Proto != 0 {
		w = append(w, "meta l4proto "+protoName(r.L4Proto))
	}
	if r.Share != nil {
		w = append(w, fmt.Sprintf("numgen random mod %d < %d", r.Share.Of, r.Share.Below))
	}
	w = append(w, "counter")
	switch r.Verdict {
	case Return:
		w = append(w, "return")
	case Jump:
		w = append(w, "jump "+r.Target)
	case Goto:
		w = append(w, "goto "+r.Target)
	case Masquerade:
		w = append(w, "masquerade")
		if r.Ports != nil {
			w = append(w, fmt.Sprintf("to :%d-%d", r.Ports.First, r.Ports.Last))
		}
		if r.FullyRandom {
			w = append(w, "fully-random")
		}
	}
	if r.Comment != "" {
		w = append(w, fmt.Sprintf("comment %q", r.Comment))
	}
	return strings.Join(w, " ")
}

func protoName(p uint8) string {
	switch p {
	case unix.IPPROTO_TCP:
		return "tcp"
	case unix.IPPROTO_UDP:
		return "udp"
	case unix.IPPROTO_SCTP:
		return "sctp"
	}
	return fmt.Sprint(p)
}

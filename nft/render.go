package nft

import (
	"fmt"
	"strings"
)

// Render returns a table as `nft -f` input, in the layout of `nft list
// table inet ip-masq-agent`, without counters' values. It is used for
// golden tests, debug logs and comparison with what the kernel holds.
func Render(t Table) string { return render(t, false) }

// RenderCounters is Render with each rule's counter values, as `nft list`
// shows them: what `ip-masq-agent list` prints of the kernel's table.
func RenderCounters(t Table) string { return render(t, true) }

func render(t Table, counters bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s {\n", TableName)
	switch {
	case t.Owner != NotOwned:
		fmt.Fprintf(&b, "\t# %s (flags owner, persist)\n", t.Owner)
	case t.Persist:
		b.WriteString("\t# orphaned: its owner has exited (flags persist)\n")
	}
	if t.Dormant {
		b.WriteString("\tflags dormant\n")
	}
	for _, s := range t.Sets {
		fmt.Fprintf(&b, "\tset %s {\n\t\ttype %s\n\t\tflags interval\n", s.Name, setType(s.Key))
		if s.Odd != "" {
			fmt.Fprintf(&b, "\t\t# not the agent's: %s\n", s.Odd)
		}
		if s.Comment != "" {
			fmt.Fprintf(&b, "\t\tcomment %q\n", s.Comment)
		}
		if len(s.Elements) > 0 {
			elems := make([]string, len(s.Elements))
			for i, r := range s.Elements {
				elems[i] = rangeString(r)
			}
			fmt.Fprintf(&b, "\t\telements = { %s }\n", strings.Join(elems, ", "))
		}
		b.WriteString("\t}\n\n")
	}
	for i, c := range t.Chains {
		if i > 0 {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "\tchain %s {\n", c.Name)
		if c.Hook != nil {
			fmt.Fprintf(&b, "\t\t%s\n", hookString(*c.Hook))
		}
		if c.Odd != "" {
			fmt.Fprintf(&b, "\t\t# not the agent's: %s\n", c.Odd)
		}
		for _, r := range c.Rules {
			text := RenderRule(r)
			if counters {
				text = strings.Replace(text, "counter", fmt.Sprintf("counter packets %d bytes %d", r.Packets, r.Bytes), 1)
			}
			fmt.Fprintf(&b, "\t\t%s\n", text)
		}
		b.WriteString("\t}\n")
	}
	for _, o := range t.Objects {
		fmt.Fprintf(&b, "\t# %s (not the agent's)\n", o)
	}
	b.WriteString("}\n")
	return b.String()
}

// setType is how nft writes a set's key type; a set found with one the
// agent does not make (Odd says which) is written as ipv4_addr, as before
// the key types were named.
func setType(k SetKey) string {
	if k == 0 {
		return KeyIPv4.String()
	}
	return k.String()
}

package config

import (
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
)

// A config directory (--config DIR) means what Azure's ip-masq-agent-v2
// means by its /etc/config (cmd/ip-masq-agent-v2/ip-masq-agent.go at
// 45758a6, syncConfig, validate and merge): each file named ip-masq* is
// read into a struct of three keys that starts empty (not from the
// defaults), validated alone, and the files are merged:
//
//   - nonMasqueradeCIDRs: the union; a file that sets none (an empty file,
//     null, []) adds none. The defaults (RFC 1918, and the reserved ranges
//     with --nomasq-all-reserved-ranges) apply only to a directory without
//     any ip-masq* file: an empty union exempts nothing.
//   - masqLinkLocal, masqLinkLocalIPv6: true if any file says true.
//   - at most 64 CIDRs per file (Azure's fixed limit; the union is not
//     limited).
//
// Of the keys Azure does not read, this agent's own extensions
// (nonMasqueradeSourceCIDRs, masqueradeSourceCIDRs, egressInterfaces,
// snatAddress, snatAddressIPv6, cidrMatch) apply, each merged by its rule
// in keys.go, with a warning naming it whenever a file sets it; the keys of the original's and Baidu
// CCE's schemas (resyncInterval, cidrLimit, masqueradeCIDRs, masqOutBound,
// masqOutBoundIPv6) are ignored, as Azure ignores them, each with a
// warning naming it. config/testdata/azure-parity holds
// directories with Azure's decisions recorded from its binary;
// TestAzureParity checks the loader against them.

// AzureLimit is the number of CIDRs Azure's ip-masq-agent-v2 accepts in
// one file of a config directory.
const AzureLimit = 64

// azureKeys are the keys Azure's MasqConfig has, and the extensions of
// this agent read in a directory too (azureExtensions: every key of this
// agent's own, merged by its merge rule in keys.go).
var (
	azureExtensions = ownKeys()
	azureKeys       = append([]string{KeyNonMasq, KeyLinkLocal, KeyLinkLocal6}, azureExtensions...)
)

// ownKeys are the names of this agent's own keys (none of the original's,
// Azure's or CCE's), in the table's order.
func ownKeys() []string {
	var out []string
	for _, k := range keys {
		if k.extensionNote() == msgOwnExtension {
			out = append(out, k.Name())
		}
	}
	return out
}

// msgAzureExtension is the warning about an extension set in a file of a
// config directory.
const msgAzureExtension = "an extension of this agent, applied in a config directory too: Azure's ip-masq-agent-v2 does not read this key, so there the same directory means something else"

func isAzureKey(name string) bool { return slices.Contains(azureKeys, name) }

// msgAzureIgnored is the warning about a known key that Azure does not read.
func msgAzureIgnored(name string) string {
	s := "not read in a config directory, as Azure's ip-masq-agent-v2 does not read it: ignored"
	switch name {
	case KeyResync:
		s += " (the interval is --resync-interval's)"
	case KeyLimit:
		s += fmt.Sprintf(" (each file may hold up to %d CIDRs, as in Azure)", AzureLimit)
	default:
		s += " (it takes effect in a single --config FILE only)"
	}
	return s
}

// azureEmpty is Azure's empty config: no CIDRs, no link-local masquerade;
// the keys Azure has no notion of at the values that mean its behaviour
// (everything else masqueraded, --resync-interval).
func azureEmpty(f Flags) Config {
	c := Default(f)
	c.NonMasqueradeCIDRs = nil
	c.MasqueradeCIDRs = nil
	c.NonMasqueradeSourceCIDRs = nil
	c.MasqOutBound, c.MasqOutBoundIPv6 = true, true
	c.CIDRLimit = AzureLimit
	return c
}

// decodeAzure is decode for a file of a config directory (Flags.AzureDir):
// encoding/json into Azure's MasqConfig, which starts empty, then Azure's
// validate (at most 64 CIDRs; each valid, aligned, IPv6 only with
// --enable-ipv6).
func decodeAzure(entries []entry, f Flags, repeated []string) (Config, *decoder) {
	c := azureEmpty(f)
	d := &decoder{f: f, present: make(map[string]bool), lists: make(map[string]*list)}
	for _, k := range keys {
		if k.list() {
			d.lists[k.Name()] = &list{} // Azure's struct starts empty
		}
	}
	seen := make(map[string][]string)
	for _, e := range entries {
		name := canonical(e.key)
		switch {
		case name == "":
			d.add(finding{warning: true, key: e.key, index: -1, msg: "unknown key ignored" + suggest(e.key),
				text: fmt.Sprintf("unknown key %s ignored%s", quote(e.key), suggest(e.key))})
		case !isAzureKey(name):
			d.warnAt(e.key, -1, "%s", msgAzureIgnored(name))
		default:
			if name != e.key && !slices.Contains(seen[name], e.key) {
				d.add(finding{warning: true, key: e.key, index: -1, msg: fmt.Sprintf("read as %q; please spell it exactly", name),
					text: fmt.Sprintf("key %s read as %q; please spell it exactly", quote(e.key), name)})
			}
			seen[name] = append(seen[name], e.key)
			if name == KeyNonMasq && e.val == nil {
				d.lists[KeyNonMasq] = &list{} // encoding/json: a nil slice; the file adds no CIDR
				continue
			}
			if keyNamed(name).decodeInto(d, &c, e.key, e.val) {
				d.present[name] = true
			}
		}
	}
	d.written = make(map[string]string, len(seen))
	for name, ks := range seen {
		d.written[name] = ks[len(ks)-1]
	}
	for _, name := range azureKeys {
		ks, last := seen[name], d.written[name]
		if len(ks) > 1 || slices.Contains(repeated, last) {
			d.add(finding{warning: true, key: last, index: -1,
				msg:  fmt.Sprintf("given more than once (keys match case-insensitively); the value of the last one read, %s, is used, as in Azure's ip-masq-agent-v2", quote(last)),
				text: fmt.Sprintf("key %s given more than once (keys match case-insensitively); the value of the last one read, %s, is used, as in Azure's ip-masq-agent-v2", quote(name), quote(last))})
		}
	}
	c.NonMasqueradeCIDRs = d.checkList(KeyNonMasq)
	lists := []string{KeyNonMasq}
	for _, name := range azureExtensions {
		if l := keyNamed(name).cidrs(&c); l != nil {
			*l = d.checkList(name)
			lists = append(lists, name)
		}
	}
	for _, name := range azureExtensions {
		if d.present[name] && len(d.messages(false)) == 0 {
			d.warnAt(d.written[name], -1, "%s", msgAzureExtension)
		}
	}
	d.entryFindings = len(d.found)
	for _, name := range lists {
		if n := len(*keyNamed(name).cidrs(&c)); n > AzureLimit {
			d.errorAt(d.written[name], -1, "%d CIDRs exceed the limit of %d per file of a config directory (Azure's ip-masq-agent-v2's; cidrLimit is not read there)", n, AzureLimit)
		}
	}
	return c, d
}

// mergeAzure merges the files of a directory as Azure does; with no file,
// the defaults.
func mergeAzure(f Flags, parts []part) Config {
	if len(parts) == 0 {
		return Default(f)
	}
	c := azureEmpty(f)
	for _, p := range parts {
		c.NonMasqueradeCIDRs = unionSet(c.NonMasqueradeCIDRs, p.c.NonMasqueradeCIDRs) // Azure's union is a set
		c.MasqLinkLocal = c.MasqLinkLocal || p.c.MasqLinkLocal
		c.MasqLinkLocalIPv6 = c.MasqLinkLocalIPv6 || p.c.MasqLinkLocalIPv6
	}
	// This agent's own keys, each by its merge rule over the files that set it.
	c.CIDRLimit = max(AzureLimit, len(c.NonMasqueradeCIDRs))
	for _, name := range azureExtensions {
		k := keyNamed(name)
		var set []*Config
		for i := range parts {
			if parts[i].present[name] {
				set = append(set, &parts[i].c)
			}
		}
		if len(set) > 0 {
			k.mergeInto(&c, set)
		}
		if l := k.cidrs(&c); l != nil {
			c.CIDRLimit = max(c.CIDRLimit, len(*l))
		}
	}
	return c
}

// unionSet appends to a the prefixes of b that it lacks.
func unionSet(a, b []netip.Prefix) []netip.Prefix {
	for _, p := range b {
		if !slices.Contains(a, p) {
			a = append(a, p)
		}
	}
	return a
}

// msgEmptyUnion is the warning about a directory whose files exempt no
// destination: Azure's meaning, which differs from the defaults that a
// directory without files (or a single file without the key) gets.
func msgEmptyUnion(f Flags) string {
	def := Default(f).NonMasqueradeCIDRs
	ss := make([]string, len(def))
	for i, p := range def {
		ss[i] = p.String()
	}
	return fmt.Sprintf("no file named ip-masq* sets a non-empty %s: as in Azure's ip-masq-agent-v2, the directory exempts no destination "+
		"but link-local, so %s are masqueraded (the defaults apply only to a directory without ip-masq* files)",
		KeyNonMasq, strings.Join(ss, ", "))
}

// danglingTarget returns the target of path when it is a symlink whose
// target does not exist.
func danglingTarget(path string) (string, bool) {
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode()&os.ModeSymlink == 0 {
		return "", false
	}
	target, err := os.Readlink(path)
	if err != nil {
		return "", false
	}
	return target, true
}

// DirNotes returns the warnings about a config directory as a whole, as
// the agent logs them with --config DIR (for validate, which checks each
// file itself, and says with Files when there is none): symlinks to
// missing files, subdirectories named ip-masq*, an empty union. nil for a
// path that is not a directory.
func DirNotes(path string, f Flags) []string {
	if KindOf(path) != SourceDir {
		return nil
	}
	var l Loader
	l.path, l.kind, l.decided = path, SourceDir, true
	_, _, notes, _ := l.loadDir(path, f)
	// Files says that there is no file (the tools' wording).
	return slices.DeleteFunc(notes, func(n string) bool { return strings.HasSuffix(n, msgNoFiles) })
}

// msgNoFiles is the warning about a directory without ip-masq* files.
const msgNoFiles = "no file whose name starts with \"ip-masq\"; using the defaults"

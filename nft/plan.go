package nft

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
)

// Op is one operation of a transaction on table inet ip-masq-agent.
type Op struct {
	Verb Verb
	Kind Kind
	// Name is the set, chain or object; for rules, the chain; for
	// elements, the set.
	Name     string
	Set      *Set   // AddSet: the set's shape (its elements come as AddElements)
	Chain    *Chain // AddChain: the chain's hook (its rules come as AddRule)
	Rule     *Rule
	Elements []Range
	Key      SetKey // elements of a set whose key is not an address (ifname): how String writes them
	Object   *Object
	// Table: AddTable and UpdateTable set these flags; Exclusive makes
	// AddTable fail if the table exists (NLM_F_EXCL).
	Owned, Persist, Exclusive bool
}

type Verb uint8

const (
	Add Verb = iota
	Delete
	Flush
	Update
)

type Kind uint8

const (
	KindTable Kind = iota
	KindSet
	KindChain
	KindRule
	KindElements
	KindObject
)

// Plan is the ordered operations of one transaction: the kernel applies
// all of them or none.
type Plan struct {
	Ops []Op
	// Recreate is set when the plan deletes and re-creates the table:
	// while such a transaction commits, new connections may meet no table
	// for a moment (measured: 2-6% of new connections to non-masquerade
	// destinations were masqueraded during repeated swaps), so it is only
	// done when the table cannot be refilled in place.
	Recreate bool
	// Why says, for a plan that re-creates, what made it necessary.
	Why string
}

// Empty reports whether the plan sends nothing.
func (p Plan) Empty() bool { return len(p.Ops) == 0 }

// String writes the plan one operation a line, in nft's syntax.
func (p Plan) String() string {
	var b strings.Builder
	for _, op := range p.Ops {
		b.WriteString(op.String())
		b.WriteByte('\n')
	}
	return b.String()
}

func (op Op) String() string {
	verb := [...]string{"add", "delete", "flush", "update"}[op.Verb]
	switch op.Kind {
	case KindTable:
		var flags []string
		if op.Owned {
			flags = append(flags, "owner")
		}
		if op.Persist {
			flags = append(flags, "persist")
		}
		s := fmt.Sprintf("%s table inet %s", verb, TableName)
		if op.Exclusive {
			s = fmt.Sprintf("create table inet %s", TableName)
		}
		switch {
		case op.Verb == Delete:
		case len(flags) > 0:
			s += " { flags " + strings.Join(flags, ", ") + " }"
		default:
			s += " { }"
		}
		return s
	case KindSet:
		if op.Verb == Add {
			return fmt.Sprintf("add set inet %s %s { type %s; flags interval; comment %q; }", TableName, op.Name, setType(op.Set.Key), op.Set.Comment)
		}
		return fmt.Sprintf("%s set inet %s %s", verb, TableName, op.Name)
	case KindChain:
		if op.Verb == Add && op.Chain.Hook != nil {
			return fmt.Sprintf("add chain inet %s %s { %s }", TableName, op.Name, hookString(*op.Chain.Hook))
		}
		return fmt.Sprintf("%s chain inet %s %s", verb, TableName, op.Name)
	case KindRule:
		return fmt.Sprintf("add rule inet %s %s %s", TableName, op.Name, RenderRule(*op.Rule))
	case KindElements:
		elems := make([]string, len(op.Elements))
		for i, r := range op.Elements {
			elems[i] = elementString(op.Key, r)
		}
		return fmt.Sprintf("%s element inet %s %s { %s }", verb, TableName, op.Name, strings.Join(elems, ", "))
	case KindObject:
		return fmt.Sprintf("delete %s inet %s %s", op.Object.Kind, TableName, op.Object.Name)
	}
	return "?"
}

// hookString writes a base chain's hook as `nft list` does.
func hookString(h Hook) string {
	prio := fmt.Sprint(h.Priority)
	if h.Type == "nat" && h.Hook == "postrouting" {
		switch d := h.Priority - 100; {
		case d > 0:
			prio = fmt.Sprintf("srcnat + %d", d)
		case d < 0:
			prio = fmt.Sprintf("srcnat - %d", -d)
		default:
			prio = "srcnat"
		}
	}
	return fmt.Sprintf("type %s hook %s priority %s; policy %s;", h.Type, h.Hook, prio, h.Policy)
}

// ErrOwnedByOther is returned when another process's netlink socket owns
// the table: the kernel refuses every change but that socket's.
var ErrOwnedByOther = errors.New("table inet " + TableName + " is owned by another process (another ip-masq-agent?)")

// RefusedError is a transaction the kernel refused at one of its
// messages, Op (what a kernel that lacks a part of the table answers).
type RefusedError struct {
	Op  string
	Err error
}

func (e *RefusedError) Error() string { return e.Op + ": " + e.Err.Error() }

func (e *RefusedError) Unwrap() error { return e.Err }

// PlanFor returns the transaction that turns the kernel's table found (nil:
// there is none) into want, changing it in place wherever the kernel
// allows: only the elements and rules that differ are sent, so that
// counters of unchanged rules keep counting and no packet meets a table
// without its rules. Objects the agent did not make are removed.
func PlanFor(found *Table, want Table) (Plan, error) {
	switch {
	case found == nil:
		return create(want, true), nil
	case found.Owner == OwnedByOther:
		return Plan{}, ErrOwnedByOther
	case want.Owner == OwnedByUs && found.Owner == NotOwned && !found.Persist:
		// The kernel adopts only an orphaned persistent table.
		return Recreate(found, want, "the table was made without ownership"), nil
	}
	var p Plan
	if found.Dormant || found.Owner != want.Owner {
		p.Ops = append(p.Ops, Op{Verb: Update, Kind: KindTable, Owned: want.Owner == OwnedByUs, Persist: want.Owner == OwnedByUs})
	}

	// What is replaced (a set or chain of the wrong shape), what is
	// removed (not wanted at all), and which chains get their rules anew.
	replaced := map[string]bool{} // sets and chains, by name: names are distinct kinds in nft, but not here
	var flush, delChains, delSets []string
	for _, s := range found.Sets {
		w := want.Set(s.Name)
		switch {
		case w == nil:
			delSets = append(delSets, s.Name)
		case !w.sameShape(s):
			delSets = append(delSets, s.Name)
			replaced["set "+s.Name] = true
		}
	}
	for _, c := range found.Chains {
		w := want.Chain(c.Name)
		switch {
		case w == nil:
			delChains = append(delChains, c.Name)
		case !w.sameShape(c):
			delChains = append(delChains, c.Name)
			replaced["chain "+c.Name] = true
		}
	}
	// A chain is flushed when it goes, when its rules differ, or when a
	// rule of it refers to a set or chain that goes (its wanted rules are
	// added back afterwards).
	for _, c := range found.Chains {
		w := want.Chain(c.Name)
		if slices.Contains(delChains, c.Name) || !slices.EqualFunc(w.Rules, c.Rules, Rule.equal) ||
			refersTo(c, replaced, delSets, delChains) {
			flush = append(flush, c.Name)
		}
	}
	for _, name := range flush {
		p.Ops = append(p.Ops, Op{Verb: Flush, Kind: KindChain, Name: name})
	}
	for _, name := range delChains {
		p.Ops = append(p.Ops, Op{Verb: Delete, Kind: KindChain, Name: name})
	}
	for _, name := range delSets {
		p.Ops = append(p.Ops, Op{Verb: Delete, Kind: KindSet, Name: name})
	}
	for _, o := range found.Objects {
		p.Ops = append(p.Ops, Op{Verb: Delete, Kind: KindObject, Name: o.Name, Object: &o})
	}
	for _, s := range want.Sets {
		f := found.Set(s.Name)
		if f == nil || replaced["set "+s.Name] {
			p.Ops = append(p.Ops, addSet(s)...)
			continue
		}
		removed, added := diffRanges(f.Elements, s.Elements)
		if len(removed) > 0 {
			p.Ops = append(p.Ops, Op{Verb: Delete, Kind: KindElements, Name: s.Name, Elements: removed, Key: nameKey(s.Key)})
		}
		if len(added) > 0 {
			p.Ops = append(p.Ops, Op{Verb: Add, Kind: KindElements, Name: s.Name, Elements: added, Key: nameKey(s.Key)})
		}
	}
	for _, c := range want.Chains {
		if found.Chain(c.Name) == nil || replaced["chain "+c.Name] {
			p.Ops = append(p.Ops, Op{Verb: Add, Kind: KindChain, Name: c.Name, Chain: &Chain{Name: c.Name, Hook: c.Hook}})
		}
	}
	for _, c := range want.Chains {
		if found.Chain(c.Name) == nil || slices.Contains(flush, c.Name) {
			p.Ops = append(p.Ops, addRules(c)...)
		}
	}
	return p, nil
}

// refersTo reports whether a found chain has a rule that looks up a set or
// jumps to a chain that the plan deletes.
func refersTo(c Chain, replaced map[string]bool, delSets, delChains []string) bool {
	for _, r := range c.Rules {
		for _, e := range r.expressions() {
			switch name := referenced(e); {
			case name == "":
			case slices.Contains(delSets, name), slices.Contains(delChains, name), replaced["set "+name], replaced["chain "+name]:
				return true
			}
		}
	}
	return false
}

// Recreate returns the transaction that deletes the table (if found is not
// nil) and creates want from nothing: the fallback when the kernel refuses
// an in-place plan, and the way to a table whose flags cannot change.
func Recreate(found *Table, want Table, why string) Plan {
	p := create(want, true)
	if found != nil {
		p.Ops = append([]Op{{Verb: Delete, Kind: KindTable}}, p.Ops...)
	}
	p.Recreate, p.Why = found != nil, why
	return p
}

// create returns the operations that make want from nothing.
func create(want Table, exclusive bool) Plan {
	own := want.Owner == OwnedByUs
	p := Plan{Ops: []Op{{Verb: Add, Kind: KindTable, Owned: own, Persist: own, Exclusive: exclusive}}}
	for _, s := range want.Sets {
		p.Ops = append(p.Ops, addSet(s)...)
	}
	for _, c := range want.Chains {
		p.Ops = append(p.Ops, Op{Verb: Add, Kind: KindChain, Name: c.Name, Chain: &Chain{Name: c.Name, Hook: c.Hook}})
	}
	for _, c := range want.Chains {
		p.Ops = append(p.Ops, addRules(c)...)
	}
	return p
}

func addSet(s Set) []Op {
	shape := s
	shape.Elements = nil
	ops := []Op{{Verb: Add, Kind: KindSet, Name: s.Name, Set: &shape}}
	if len(s.Elements) > 0 {
		ops = append(ops, Op{Verb: Add, Kind: KindElements, Name: s.Name, Elements: s.Elements, Key: nameKey(s.Key)})
	}
	return ops
}

// nameKey is an element op's Key: the set's, when it is not an address.
func nameKey(k SetKey) SetKey {
	if k.Family() == 0 {
		return k
	}
	return 0
}

func addRules(c Chain) []Op {
	var ops []Op
	for i := range c.Rules {
		ops = append(ops, Op{Verb: Add, Kind: KindRule, Name: c.Name, Rule: &c.Rules[i]})
	}
	return ops
}

// Exec applies one operation to an in-memory table as the kernel would,
// with the kernel's refusals: it is how Fake runs plans, and how the plan
// property tests check that a plan turns found into want. t is nil when
// there is no table; AddTable makes one.
func Exec(t **Table, op Op) error {
	if op.Kind == KindTable {
		switch {
		case op.Verb == Delete && *t == nil:
			return syscall.ENOENT
		case op.Verb == Delete:
			*t = nil
		case *t == nil && op.Verb == Update:
			return syscall.ENOENT
		case *t != nil && op.Exclusive:
			return syscall.EEXIST
		default:
			if *t == nil {
				*t = &Table{}
			}
			(*t).Dormant = false
			(*t).Owner, (*t).Persist = NotOwned, op.Persist
			if op.Owned {
				(*t).Owner = OwnedByUs
			}
		}
		return nil
	}
	tab := *t
	if tab == nil {
		return syscall.ENOENT
	}
	switch op.Kind {
	case KindSet:
		i := slices.IndexFunc(tab.Sets, func(s Set) bool { return s.Name == op.Name })
		switch {
		case op.Verb == Add && i >= 0:
			return syscall.EEXIST
		case op.Verb == Add:
			tab.Sets = append(tab.Sets, *op.Set)
		case i < 0:
			return syscall.ENOENT
		case op.Verb == Delete && tab.uses(op.Name):
			return syscall.EBUSY
		case op.Verb == Delete:
			tab.Sets = slices.Delete(tab.Sets, i, i+1)
		}
	case KindChain:
		i := slices.IndexFunc(tab.Chains, func(c Chain) bool { return c.Name == op.Name })
		switch {
		case op.Verb == Add && i >= 0:
			return syscall.EEXIST
		case op.Verb == Add:
			tab.Chains = append(tab.Chains, *op.Chain)
		case i < 0:
			return syscall.ENOENT
		case op.Verb == Flush:
			tab.Chains[i].Rules = nil
		case op.Verb == Delete && tab.uses(op.Name):
			return syscall.EBUSY
		case op.Verb == Delete:
			tab.Chains = slices.Delete(tab.Chains, i, i+1)
		}
	case KindRule:
		c := tab.Chain(op.Name)
		if c == nil {
			return syscall.ENOENT
		}
		for _, e := range op.Rule.expressions() {
			name := referenced(e)
			if name != "" && tab.Set(name) == nil && tab.Chain(name) == nil {
				return syscall.ENOENT
			}
		}
		r := *op.Rule
		r.exprs = nil
		c.Rules = append(c.Rules, r)
	case KindElements:
		s := tab.Set(op.Name)
		if s == nil {
			return syscall.ENOENT
		}
		for _, r := range op.Elements {
			i, found := slices.BinarySearchFunc(s.Elements, r, compareRange)
			switch {
			case op.Verb == Delete && !found:
				return syscall.ENOENT
			case op.Verb == Delete:
				s.Elements = slices.Delete(s.Elements, i, i+1)
			case found || (i > 0 && s.Elements[i-1].To().Compare(r.From()) >= 0) ||
				(i < len(s.Elements) && s.Elements[i].From().Compare(r.To()) <= 0):
				return syscall.EEXIST // overlaps
			default:
				s.Elements = slices.Insert(s.Elements, i, r)
			}
		}
	case KindObject:
		i := slices.IndexFunc(tab.Objects, func(o Object) bool { return o == *op.Object })
		if i < 0 {
			return syscall.ENOENT
		}
		tab.Objects = slices.Delete(tab.Objects, i, i+1)
	}
	return nil
}

// uses reports whether a rule of t refers to the set or chain name.
func (t *Table) uses(name string) bool {
	for _, c := range t.Chains {
		for _, r := range c.Rules {
			for _, e := range r.expressions() {
				if referenced(e) == name {
					return true
				}
			}
		}
	}
	return false
}

// ExecPlan runs a whole plan on a copy of t, all or nothing, as a
// transaction: it returns the new table, or the first refusal.
func ExecPlan(t *Table, p Plan) (*Table, error) {
	// Room for the elements the plan adds, so that adding one to a set
	// of 100,000 does not copy it a second time.
	var room map[string]int
	for _, op := range p.Ops {
		if op.Kind == KindElements && op.Verb == Add {
			if room == nil {
				room = map[string]int{}
			}
			room[op.Name] += len(op.Elements)
		}
	}
	cur := t.clone(room)
	for i, op := range p.Ops {
		if err := Exec(&cur, op); err != nil {
			return t, fmt.Errorf("%s (operation %d of %d): %w", op, i+1, len(p.Ops), err)
		}
	}
	return cur, nil
}

// Clone returns a deep copy (nil for nil).
func (t *Table) Clone() *Table { return t.clone(nil) }

// clone is Clone with room for room[name] more elements in set name.
func (t *Table) clone(room map[string]int) *Table {
	if t == nil {
		return nil
	}
	c := *t
	c.Sets = slices.Clone(t.Sets)
	for i := range c.Sets {
		s := &c.Sets[i]
		if n := room[s.Name]; n > 0 {
			s.Elements = append(make([]Range, 0, len(s.Elements)+n), s.Elements...)
		} else {
			s.Elements = slices.Clone(s.Elements)
		}
	}
	c.Chains = slices.Clone(t.Chains)
	for i := range c.Chains {
		c.Chains[i].Rules = slices.Clone(c.Chains[i].Rules)
	}
	c.Objects = slices.Clone(t.Objects)
	return &c
}

// DiffPlan returns what the agent would send to turn found into want,
// ownership aside: what `ip-masq-agent diff` prints. It is empty when the
// content is the same.
func DiffPlan(found *Table, want Table) Plan {
	if found != nil {
		f := *found
		f.Owner, f.Persist = NotOwned, false
		found = &f
	}
	want.Owner = NotOwned
	p, _ := PlanFor(found, want)
	return p
}

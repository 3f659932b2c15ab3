package policy

import (
	"slices"
	"strings"
)

// Action is what a grant allows.
type Action string

// The actions a role may be granted. Every action implies View of the same
// projections and scopes: an operator picks rows by looking at them.
const (
	View    Action = "view"
	Replay  Action = "replay"
	Discard Action = "discard"
	Archive Action = "archive"
	Restore Action = "restore"
	// Pause pauses and resumes a projection.
	Pause Action = "pause"
	// Unmask reads a payload with its masked fields, each read audited.
	Unmask Action = "unmask"
)

// Actions are every action, in the order messages list them.
var Actions = []Action{View, Replay, Discard, Archive, Restore, Pause, Unmask}

// Every is the pattern of every projection or scope key.
const Every = "*"

// Grant is one role's: its actions on its projections and scope keys.
type Grant struct {
	Role        string
	Actions     []Action
	Projections []string
	Scopes      []string
}

func (g Grant) allows(a Action) bool {
	return a == View || slices.Contains(g.Actions, a)
}

// Grants are what one actor may do: the grants of all its roles. A zero
// Grants allows nothing.
type Grants struct {
	list []Grant
}

// NewGrants are the grants list.
func NewGrants(list ...Grant) *Grants { return &Grants{list: list} }

// Operator and Viewer are the grants without a policy file: the console's
// operators may do everything everywhere, its read-only users may look.
var (
	Operator = NewGrants(Grant{Role: "operator", Actions: Actions, Projections: []string{Every}, Scopes: []string{Every}})
	Viewer   = NewGrants(Grant{Role: "viewer", Actions: []Action{View}, Projections: []string{Every}, Scopes: []string{Every}})
)

// None reports whether g allows nothing at all.
func (g *Grants) None() bool { return g == nil || len(g.list) == 0 }

// Can reports whether a may be done on an event of projection with scope
// key scope ("" for an event without one).
func (g *Grants) Can(a Action, projection, scope string) bool {
	for _, gr := range g.grantsOf(a) {
		if matchesAny(gr.Projections, projection) && matchesAny(gr.Scopes, scope) {
			return true
		}
	}
	return false
}

// CanAnywhere reports whether a may be done on some events.
func (g *Grants) CanAnywhere(a Action) bool { return len(g.grantsOf(a)) > 0 }

// Whole reports whether a may be done on every scope of projection: what
// an action on the projection as a whole (pause) needs, and what its
// aggregates (lag, backlog, throughput) show.
func (g *Grants) Whole(a Action, projection string) bool {
	for _, gr := range g.grantsOf(a) {
		if matchesAny(gr.Projections, projection) && slices.Contains(gr.Scopes, Every) {
			return true
		}
	}
	return false
}

// Visible are the projections of all on which a may be done somewhere.
func (g *Grants) Visible(a Action, all []string) []string {
	var out []string
	for _, p := range all {
		if slices.ContainsFunc(g.grantsOf(a), func(gr Grant) bool { return matchesAny(gr.Projections, p) }) {
			out = append(out, p)
		}
	}
	return out
}

func (g *Grants) grantsOf(a Action) []Grant {
	if g == nil {
		return nil
	}
	var out []Grant
	for _, gr := range g.list {
		if gr.allows(a) {
			out = append(out, gr)
		}
	}
	return out
}

func (g *Grants) roleNames() []string {
	var names []string
	for _, gr := range g.grantsList() {
		names = append(names, gr.Role)
	}
	return sortedUnique(names)
}

func (g *Grants) scopePatterns() []string {
	var s []string
	for _, gr := range g.grantsList() {
		s = append(s, gr.Scopes...)
	}
	return sortedUnique(s)
}

func (g *Grants) grantsList() []Grant {
	if g == nil {
		return nil
	}
	return g.list
}

// matchesAny reports whether s matches one of the patterns.
func matchesAny(patterns []string, s string) bool {
	return slices.ContainsFunc(patterns, func(p string) bool { return Match(p, s) })
}

// Match reports whether s matches pattern, in which * stands for any run
// of characters (none included) and everything else for itself.
func Match(pattern, s string) bool {
	parts := strings.Split(pattern, "*")
	if len(parts) == 1 {
		return pattern == s
	}
	if !strings.HasPrefix(s, parts[0]) {
		return false
	}
	s = s[len(parts[0]):]
	last := parts[len(parts)-1]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(s, p)
		if i < 0 {
			return false
		}
		s = s[i+len(p):]
	}
	return strings.HasSuffix(s, last) && len(s) >= len(last)
}

// Allowed is what the SQL of a read or an action is held to: pairs of
// LIKE patterns, a row passing when its projection and scope key (empty
// for none) match one pair. Nil allows every row.
type Allowed struct {
	Projections, Scopes []string
}

// Allowed is the pairs a may be done on; nil when g allows a on every
// projection and scope, an empty (non-nil) Allowed when on none.
func (g *Grants) Allowed(a Action) *Allowed {
	out := &Allowed{Projections: []string{}, Scopes: []string{}}
	for _, gr := range g.grantsOf(a) {
		for _, p := range gr.Projections {
			for _, s := range gr.Scopes {
				if p == Every && s == Every {
					return nil
				}
				out.Projections = append(out.Projections, Like(p))
				out.Scopes = append(out.Scopes, Like(s))
			}
		}
	}
	return out
}

// Like is pattern as a LIKE pattern: % and _ and the escape \ stand for
// themselves, * for any run.
func Like(pattern string) string {
	r := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`, `*`, `%`)
	return r.Replace(pattern)
}

// ProjectionsArg and ScopesArg are a's pairs as SQL parameters: NULL for
// a nil Allowed, every row.
func (a *Allowed) ProjectionsArg() any {
	if a == nil {
		return nil
	}
	return a.Projections
}

// ScopesArg: see ProjectionsArg.
func (a *Allowed) ScopesArg() any {
	if a == nil {
		return nil
	}
	return a.Scopes
}

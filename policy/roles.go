package policy

import (
	"slices"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

var roleKeys = []string{"actions", "projections", "scopes"}

func actionNames() string {
	var s []string
	for _, a := range Actions {
		s = append(s, string(a))
	}
	return strings.Join(s, ", ")
}

func (r reader) roles(n *yaml.Node) (map[string]roleEntry, error) {
	m, err := r.mapping(n, "roles", nil)
	if err != nil {
		return nil, err
	}
	out := map[string]roleEntry{}
	for _, name := range sortedKeys(m) {
		body := m[name]
		key := "roles." + name
		fields, err := r.mapping(body, key, roleKeys)
		if err != nil {
			return nil, err
		}
		for _, k := range roleKeys {
			// Every key is required: a role that left out scopes would
			// otherwise mean either nothing or everything, and a reader of
			// the file could not tell which.
			if fields[k] == nil {
				return nil, r.fail(body, key+"."+k, `is required (write ["*"] for every one)`)
			}
		}
		e, err := r.role(name, key, fields)
		if err != nil {
			return nil, err
		}
		out[name] = e
	}
	return out, nil
}

func (r reader) role(name, key string, fields map[string]*yaml.Node) (roleEntry, error) {
	actions, _, err := r.list(fields["actions"], key+".actions")
	if err != nil {
		return roleEntry{}, err
	}
	g := Grant{Role: name}
	for i, a := range actions {
		if !slices.Contains(Actions, Action(a)) {
			return roleEntry{}, r.fail(fields["actions"].Content[i], key+".actions", "unknown action %q (known: %s)", a, actionNames())
		}
		g.Actions = append(g.Actions, Action(a))
	}
	e := roleEntry{}
	if g.Projections, e.projectionLines, err = r.list(fields["projections"], key+".projections"); err != nil {
		return roleEntry{}, err
	}
	if g.Scopes, _, err = r.list(fields["scopes"], key+".scopes"); err != nil {
		return roleEntry{}, err
	}
	e.grant = g
	return e, nil
}

// members reads users: or groups:, each name to a list of defined roles.
func (r reader) members(n *yaml.Node, what string, roles map[string]roleEntry) (map[string][]string, error) {
	out := map[string][]string{}
	if n == nil {
		return out, nil
	}
	m, err := r.mapping(n, what, nil)
	if err != nil {
		return nil, err
	}
	for _, name := range sortedKeys(m) {
		v := m[name]
		key := what + "." + name
		list, _, err := r.list(v, key)
		if err != nil {
			return nil, err
		}
		for i, role := range list {
			if _, ok := roles[role]; !ok {
				return nil, r.fail(v.Content[i], key, "names role %q, which roles does not define (defined: %s)",
					role, strings.Join(sortedKeys(roles), ", "))
			}
		}
		out[name] = list
	}
	return out, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// For is the grants of user, a member of groups: those of the roles the
// file gives the user by name and those it gives any of the groups.
func (p *Policy) For(user string, groups []string) *Grants {
	var names []string
	names = append(names, p.users[user]...)
	for _, g := range groups {
		names = append(names, p.groups[g]...)
	}
	g := &Grants{}
	for _, name := range sortedUnique(names) {
		g.list = append(g.list, p.roles[name].grant)
	}
	return g
}

// CheckProjections refuses a role that names a projection not in known
// (the projections this replica runs): a typo would grant nothing, and no
// one would be told. Patterns with * are not checked.
func (p *Policy) CheckProjections(known []string) error {
	for _, name := range sortedKeys(p.roles) {
		e := p.roles[name]
		for _, proj := range e.grant.Projections {
			if !strings.Contains(proj, Every) && !slices.Contains(known, proj) {
				return &FileError{File: p.File, Line: e.projectionLines[proj], Key: "roles." + name + ".projections",
					Problem: "names projection " + quote(proj) + ", which this replica does not run (it runs: " + strings.Join(known, ", ") + ")"}
			}
		}
	}
	return nil
}

func quote(s string) string { return `"` + s + `"` }

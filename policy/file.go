package policy

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Policy is a policy file: roles, and the users and groups they are
// granted to.
type Policy struct {
	File   string
	roles  map[string]roleEntry
	users  map[string][]string
	groups map[string][]string
}

type roleEntry struct {
	grant Grant
	// projectionLines are the lines of the role's projections, for
	// CheckProjections' errors.
	projectionLines map[string]int
}

// FileError is a policy file that was refused: where and why.
type FileError struct {
	File    string
	Line    int
	Key     string
	Problem string
}

func (e *FileError) Error() string {
	return fmt.Sprintf("%s:%d: %s: %s", e.File, e.Line, e.Key, e.Problem)
}

type reader struct{ file string }

func (r reader) fail(n *yaml.Node, key, format string, args ...any) error {
	line := 0
	if n != nil {
		line = n.Line
	}
	return &FileError{File: r.file, Line: line, Key: key, Problem: fmt.Sprintf(format, args...)}
}

// Load reads the policy file at path. Any error refuses the whole file,
// naming file:line:key: a policy that is half read would grant what its
// author did not write, or hide what they did.
func Load(path string) (*Policy, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, &FileError{File: path, Key: "(file)", Problem: err.Error()}
	}
	return Parse(path, b)
}

// Parse reads a policy file's text; file names it in errors.
func Parse(file string, text []byte) (*Policy, error) {
	r := reader{file: file}
	var doc yaml.Node
	if err := yaml.Unmarshal(text, &doc); err != nil {
		return nil, &FileError{File: file, Key: "(file)", Problem: err.Error()}
	}
	if len(doc.Content) == 0 {
		return nil, r.fail(&doc, "(file)", "is empty: it needs roles, and users or groups")
	}
	top, err := r.mapping(doc.Content[0], "", []string{"roles", "users", "groups"})
	if err != nil {
		return nil, err
	}
	p := &Policy{File: file}
	if top["roles"] == nil {
		return nil, r.fail(doc.Content[0], "roles", "is required: no role, nothing granted")
	}
	if p.roles, err = r.roles(top["roles"]); err != nil {
		return nil, err
	}
	if p.users, err = r.members(top["users"], "users", p.roles); err != nil {
		return nil, err
	}
	if p.groups, err = r.members(top["groups"], "groups", p.roles); err != nil {
		return nil, err
	}
	if len(p.users)+len(p.groups) == 0 {
		return nil, r.fail(doc.Content[0], "users", "no user or group is granted a role: give users or groups")
	}
	return p, nil
}

// mapping returns n's entries in order, refusing duplicates and, when
// allowed is not nil, keys not in it.
func (r reader) mapping(n *yaml.Node, what string, allowed []string) (map[string]*yaml.Node, error) {
	if n.Kind != yaml.MappingNode {
		return nil, r.fail(n, strings.TrimPrefix(what, "."), "must be a mapping")
	}
	m := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i]
		key := strings.TrimPrefix(what+"."+k.Value, ".")
		switch {
		case allowed != nil && !slices.Contains(allowed, k.Value):
			return nil, r.fail(k, key, "unknown key (known here: %s)", strings.Join(allowed, ", "))
		case m[k.Value] != nil:
			return nil, r.fail(k, key, "given twice")
		case strings.TrimSpace(k.Value) == "":
			return nil, r.fail(k, key, "an empty name")
		}
		m[k.Value] = n.Content[i+1]
		m[k.Value].Line = max(m[k.Value].Line, k.Line)
	}
	return m, nil
}

// list reads a non-empty list of non-empty, distinct strings.
func (r reader) list(n *yaml.Node, key string) ([]string, map[string]int, error) {
	if n.Kind != yaml.SequenceNode {
		return nil, nil, r.fail(n, key, "must be a list, e.g. [a, b]")
	}
	if len(n.Content) == 0 {
		return nil, nil, r.fail(n, key, "is empty")
	}
	var out []string
	lines := map[string]int{}
	for _, v := range n.Content {
		switch {
		case v.Kind != yaml.ScalarNode || strings.TrimSpace(v.Value) == "":
			return nil, nil, r.fail(v, key, "each entry must be a non-empty string")
		case lines[v.Value] != 0:
			return nil, nil, r.fail(v, key, "%q is listed twice", v.Value)
		}
		out = append(out, v.Value)
		lines[v.Value] = v.Line
	}
	return out, lines, nil
}

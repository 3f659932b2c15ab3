package mask

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// Marker replaces a masked value.
const Marker = "***"

// Mask is a compiled set of paths. The nil *Mask masks nothing.
type Mask struct {
	paths [][]string
	src   []string
}

// PathError is a path Compile refuses, and why.
type PathError struct {
	Path    string
	Problem string
}

func (e *PathError) Error() string { return fmt.Sprintf("mask path %q %s", e.Path, e.Problem) }

// Compile checks and compiles paths; none gives the nil *Mask.
func Compile(paths []string) (*Mask, error) {
	if len(paths) == 0 {
		return nil, nil
	}
	m := &Mask{}
	for _, p := range paths {
		segs, err := parsePath(p)
		if err != nil {
			return nil, err
		}
		m.paths = append(m.paths, segs)
		m.src = append(m.src, p)
	}
	return m, nil
}

// parsePath splits p into its segments, refusing what names no field.
func parsePath(p string) ([]string, error) {
	if strings.TrimSpace(p) == "" {
		return nil, &PathError{Path: p, Problem: "is empty"}
	}
	segs := strings.Split(p, ".")
	for _, s := range segs {
		switch {
		case s == "":
			return nil, &PathError{Path: p, Problem: "has an empty segment (a leading, trailing or doubled dot)"}
		case s != "*" && strings.Contains(s, "*"):
			return nil, &PathError{Path: p, Problem: "has " + s + ": * stands alone for a whole level, it is not a pattern"}
		case strings.TrimSpace(s) != s:
			return nil, &PathError{Path: p, Problem: "has a segment with leading or trailing spaces"}
		}
	}
	return segs, nil
}

// Paths are the paths as given.
func (m *Mask) Paths() []string {
	if m == nil {
		return nil
	}
	return append([]string{}, m.src...)
}

// Empty reports whether m masks nothing.
func (m *Mask) Empty() bool { return m == nil || len(m.paths) == 0 }

// Payload is payload with each masked value replaced by Marker; its keys
// come out sorted. A payload that is not JSON is an error: the caller
// shows none of it.
func (m *Mask) Payload(payload []byte) ([]byte, error) {
	if m.Empty() {
		return payload, nil
	}
	v, err := decode(payload)
	if err != nil {
		return nil, err
	}
	masked := m.walk(v, m.start(), func(any) any { return Marker })
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(masked); err != nil {
		return nil, err
	}
	return bytes.TrimRight(out.Bytes(), "\n"), nil
}

func decode(payload []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("payload is not JSON: %w", err)
	}
	return v, nil
}

// state is how far one path has matched: the index of the path and of its
// next segment. A state at the end of its path masks all below it.
type state struct{ path, next int }

func (m *Mask) start() []state {
	s := make([]state, len(m.paths))
	for i := range m.paths {
		s[i] = state{path: i}
	}
	return s
}

// complete reports whether one of states has matched its whole path.
func (m *Mask) complete(states []state) bool {
	for _, s := range states {
		if s.next == len(m.paths[s.path]) {
			return true
		}
	}
	return false
}

// walk rebuilds v, replacing each leaf under a complete path with hide(leaf).
func (m *Mask) walk(v any, states []state, hide func(any) any) any {
	if len(states) == 0 {
		return v
	}
	done := m.complete(states)
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, child := range x {
			out[k] = m.walk(child, m.step(states, k, done), hide)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, child := range x {
			out[i] = m.walk(child, states, hide)
		}
		return out
	}
	if done {
		return hide(v)
	}
	return v
}

// step is the states that match key one level down; once a path is
// complete it stays so.
func (m *Mask) step(states []state, key string, done bool) []state {
	if done {
		return []state{{path: 0, next: len(m.paths[0])}}
	}
	var next []state
	for _, s := range states {
		if seg := m.paths[s.path][s.next]; seg == "*" || seg == key {
			next = append(next, state{path: s.path, next: s.next + 1})
		}
	}
	return next
}

package migrations

import (
	"bufio"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// file is one migration file, split into statements.
type file struct {
	Version int64
	Name    string
	// NoTx: each statement runs on its own, in its own transaction, and is
	// retried alone; otherwise the whole direction runs in one transaction
	// together with goose's version row.
	NoTx bool
	Up   []statement
	Down []statement
}

// statement is one SQL statement and the runner directives before it.
type statement struct {
	SQL string
	// RequiresExtension: run only when this extension is installed
	// (-- +wlproj requires-extension NAME).
	RequiresExtension string
	// Locks overrides the lock description of the dry run
	// (-- +wlproj locks TEXT), for DO blocks the classifier cannot read.
	Locks string
}

var versionRE = regexp.MustCompile(`^(\d+)_.*\.sql$`)

// loadFiles parses every migration file of fsys, in version order.
func loadFiles(fsys fs.FS) ([]file, error) {
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return nil, err
	}
	var out []file
	for _, name := range names {
		m := versionRE.FindStringSubmatch(path.Base(name))
		if m == nil {
			return nil, fmt.Errorf("migration %s: name must start with a version number", name)
		}
		v, _ := strconv.ParseInt(m[1], 10, 64)
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, err
		}
		f, err := parseFile(string(b))
		if err != nil {
			return nil, fmt.Errorf("migration %s: %w", name, err)
		}
		f.Version, f.Name = v, name
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// parseFile splits a goose-annotated SQL file: a statement ends at a line
// ending in a semicolon, except between StatementBegin and StatementEnd.
func parseFile(src string) (file, error) {
	var p parser
	sc := bufio.NewScanner(strings.NewReader(src))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		if err := p.line(sc.Text()); err != nil {
			return p.f, fmt.Errorf("line %d: %w", n, err)
		}
	}
	if err := sc.Err(); err != nil {
		return p.f, err
	}
	if p.block || strings.TrimSpace(p.buf.String()) != "" {
		return p.f, fmt.Errorf("unterminated statement at end of file")
	}
	return p.f, nil
}

// parser is parseFile's state between lines.
type parser struct {
	f       file
	dir     *[]statement // the section being read: nil before -- +goose Up
	buf     strings.Builder
	block   bool // inside StatementBegin … StatementEnd
	pending statement
}

// line reads one line of the file.
func (p *parser) line(line string) error {
	trimmed := strings.TrimSpace(line)
	switch {
	case strings.HasPrefix(trimmed, "-- +goose "):
		return p.goose(trimmed)
	case strings.HasPrefix(trimmed, "-- +wlproj "):
		return p.directive(trimmed)
	case !p.block && p.buf.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "--")):
		return nil // comments between statements
	}
	p.buf.WriteString(line)
	p.buf.WriteByte('\n')
	if !p.block && strings.HasSuffix(stripComment(trimmed), ";") {
		return p.end()
	}
	return nil
}

// goose reads one of goose's annotations.
func (p *parser) goose(trimmed string) error {
	switch strings.TrimSpace(strings.TrimPrefix(trimmed, "-- +goose ")) {
	case "Up":
		p.dir = &p.f.Up
	case "Down":
		p.dir = &p.f.Down
	case "NO TRANSACTION":
		p.f.NoTx = true
	case "StatementBegin":
		p.block = true
	case "StatementEnd":
		if !p.block {
			return fmt.Errorf("StatementEnd without StatementBegin")
		}
		p.block = false
		return p.end()
	default:
		return fmt.Errorf("unknown annotation %q", trimmed)
	}
	return nil
}

// directive reads one of wlproj's own annotations of the next statement.
func (p *parser) directive(trimmed string) error {
	words := strings.Fields(strings.TrimPrefix(trimmed, "-- +wlproj "))
	switch {
	case len(words) == 2 && words[0] == "requires-extension":
		p.pending.RequiresExtension = words[1]
	case len(words) > 1 && words[0] == "locks":
		p.pending.Locks = strings.Join(words[1:], " ")
	default:
		return fmt.Errorf("unknown directive %q", trimmed)
	}
	return nil
}

// end closes the statement read so far into the current section.
func (p *parser) end() error {
	if p.dir == nil {
		return fmt.Errorf("statement before -- +goose Up")
	}
	p.pending.SQL = strings.TrimSpace(p.buf.String())
	*p.dir = append(*p.dir, p.pending)
	p.buf.Reset()
	p.pending = statement{}
	return nil
}

// stripComment drops a trailing -- comment (outside quotes is assumed: the
// migrations put no "--" inside string literals on a statement's last line).
func stripComment(line string) string {
	if i := strings.Index(line, "--"); i >= 0 {
		return strings.TrimSpace(line[:i])
	}
	return line
}

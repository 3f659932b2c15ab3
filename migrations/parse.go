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
	var (
		f       file
		dir     *[]statement
		buf     strings.Builder
		block   bool
		pending statement
	)
	sc := bufio.NewScanner(strings.NewReader(src))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "-- +goose "):
			switch strings.TrimSpace(strings.TrimPrefix(trimmed, "-- +goose ")) {
			case "Up":
				dir = &f.Up
			case "Down":
				dir = &f.Down
			case "NO TRANSACTION":
				f.NoTx = true
			case "StatementBegin":
				block = true
			case "StatementEnd":
				if !block {
					return f, fmt.Errorf("line %d: StatementEnd without StatementBegin", n)
				}
				block = false
				if dir == nil {
					return f, fmt.Errorf("line %d: statement before -- +goose Up", n)
				}
				pending.SQL = strings.TrimSpace(buf.String())
				*dir = append(*dir, pending)
				buf.Reset()
				pending = statement{}
			default:
				return f, fmt.Errorf("line %d: unknown annotation %q", n, trimmed)
			}
			continue
		case strings.HasPrefix(trimmed, "-- +wlproj "):
			words := strings.Fields(strings.TrimPrefix(trimmed, "-- +wlproj "))
			switch {
			case len(words) == 2 && words[0] == "requires-extension":
				pending.RequiresExtension = words[1]
			case len(words) > 1 && words[0] == "locks":
				pending.Locks = strings.Join(words[1:], " ")
			default:
				return f, fmt.Errorf("line %d: unknown directive %q", n, trimmed)
			}
			continue
		case !block && buf.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "--")):
			continue // comments between statements
		}
		buf.WriteString(line)
		buf.WriteByte('\n')
		if !block && strings.HasSuffix(stripComment(trimmed), ";") {
			if dir == nil {
				return f, fmt.Errorf("line %d: statement before -- +goose Up", n)
			}
			pending.SQL = strings.TrimSpace(buf.String())
			*dir = append(*dir, pending)
			buf.Reset()
			pending = statement{}
		}
	}
	if err := sc.Err(); err != nil {
		return f, err
	}
	if block || strings.TrimSpace(buf.String()) != "" {
		return f, fmt.Errorf("unterminated statement at end of file")
	}
	return f, nil
}

// stripComment drops a trailing -- comment (outside quotes is assumed: the
// migrations put no "--" inside string literals on a statement's last line).
func stripComment(line string) string {
	if i := strings.Index(line, "--"); i >= 0 {
		return strings.TrimSpace(line[:i])
	}
	return line
}

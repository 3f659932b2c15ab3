package migrations

import (
	"fmt"
	"regexp"
	"strings"
)

// ProducerTables are the tables applications write in their own
// transactions: a lock that stops their writes stops the application.
var ProducerTables = map[string]bool{"outbox_events": true}

// Lock is the table lock a statement takes, by statement kind (a static
// table, good enough to read a migration before running it).
type Lock struct {
	Mode  string // e.g. "ACCESS EXCLUSIVE"; "none" when no existing table is locked
	Table string // empty when Mode is "none" or the table is not known
	Note  string // what the lock means for the application
}

func (l Lock) String() string {
	s := l.Mode
	if l.Table != "" {
		s += " on " + l.Table
	}
	if l.Note != "" {
		s += " (" + l.Note + ")"
	}
	return s
}

var (
	createIndexRE  = regexp.MustCompile(`(?is)^CREATE\s+(UNIQUE\s+)?INDEX\s+(CONCURRENTLY\s+)?(IF\s+NOT\s+EXISTS\s+)?(\S+)\s+ON\s+(ONLY\s+)?([A-Za-z0-9_."]+)`)
	dropIndexRE    = regexp.MustCompile(`(?is)^DROP\s+INDEX\s+(CONCURRENTLY\s+)?(IF\s+EXISTS\s+)?(\S+?);?$`)
	createTableRE  = regexp.MustCompile(`(?is)^CREATE\s+TABLE\s+(IF\s+NOT\s+EXISTS\s+)?([A-Za-z0-9_."]+)`)
	alterTableRE   = regexp.MustCompile(`(?is)^ALTER\s+TABLE\s+(IF\s+EXISTS\s+)?(ONLY\s+)?([A-Za-z0-9_."]+)\s+(.*)$`)
	createTrigRE   = regexp.MustCompile(`(?is)^CREATE\s+(OR\s+REPLACE\s+)?TRIGGER\s+.*?\s+ON\s+([A-Za-z0-9_."]+)`)
	insertRE       = regexp.MustCompile(`(?is)^INSERT\s+INTO\s+([A-Za-z0-9_."]+)`)
	updateRE       = regexp.MustCompile(`(?is)^UPDATE\s+([A-Za-z0-9_."]+)`)
	deleteRE       = regexp.MustCompile(`(?is)^DELETE\s+FROM\s+([A-Za-z0-9_."]+)`)
	dropTableRE    = regexp.MustCompile(`(?is)^DROP\s+TABLE\s+(IF\s+EXISTS\s+)?([A-Za-z0-9_."]+)`)
	noTableLockRE  = regexp.MustCompile(`(?is)^(CREATE\s+(OR\s+REPLACE\s+)?FUNCTION|CREATE\s+EXTENSION|DROP\s+FUNCTION|DROP\s+EXTENSION|COMMENT\s+ON)\b`)
	relOptionsRE   = regexp.MustCompile(`(?is)^(SET|RESET)\s*\(`)
	validateRE     = regexp.MustCompile(`(?is)^VALIDATE\s+CONSTRAINT\b`)
	addColumnRE    = regexp.MustCompile(`(?is)\bADD\s+COLUMN\s+(IF\s+NOT\s+EXISTS\s+)?`)
	dropConstrRE   = regexp.MustCompile(`(?is)\bDROP\s+(CONSTRAINT|COLUMN)\s+(IF\s+EXISTS\s+)?`)
	createIfNotRE  = regexp.MustCompile(`(?is)^CREATE\s+(UNIQUE\s+)?(TABLE|INDEX(\s+CONCURRENTLY)?|EXTENSION)\s+IF\s+NOT\s+EXISTS\b`)
	createObjectRE = regexp.MustCompile(`(?is)^CREATE\s+(UNIQUE\s+)?(TABLE|INDEX|EXTENSION)\b`)
)

// lockOf classifies st; created holds the tables created earlier in the same
// migration, which no application can hold a lock on yet.
func lockOf(st statement, created map[string]bool) Lock {
	s := strings.TrimSpace(st.SQL)
	if st.Locks != "" {
		return Lock{Mode: st.Locks}
	}
	onTable := func(mode, table, note string) Lock {
		table = strings.Trim(table, `"`)
		if created[table] {
			return Lock{Mode: "none", Note: "table created by this migration"}
		}
		return Lock{Mode: mode, Table: table, Note: note}
	}
	switch {
	case createIndexRE.MatchString(s):
		m := createIndexRE.FindStringSubmatch(s)
		if m[2] != "" {
			return onTable("SHARE UPDATE EXCLUSIVE", m[6], "writes go on; waits for older transactions")
		}
		return onTable("SHARE", m[6], "blocks writes for the whole build")
	case dropIndexRE.MatchString(s):
		m := dropIndexRE.FindStringSubmatch(s)
		if m[1] != "" {
			return Lock{Mode: "SHARE UPDATE EXCLUSIVE", Table: "the table of " + m[3], Note: "writes go on; waits for older transactions"}
		}
		return Lock{Mode: "ACCESS EXCLUSIVE", Table: "the table of " + m[3], Note: "brief"}
	case createTableRE.MatchString(s):
		return Lock{Mode: "none", Note: "new table"}
	case alterTableRE.MatchString(s):
		m := alterTableRE.FindStringSubmatch(s)
		switch {
		case relOptionsRE.MatchString(m[4]), validateRE.MatchString(m[4]):
			return onTable("SHARE UPDATE EXCLUSIVE", m[3], "writes go on")
		default:
			return onTable("ACCESS EXCLUSIVE", m[3], "brief, catalog only; blocks reads and writes while held")
		}
	case createTrigRE.MatchString(s):
		return onTable("SHARE ROW EXCLUSIVE", createTrigRE.FindStringSubmatch(s)[2], "brief; blocks writes while held")
	case insertRE.MatchString(s):
		return onTable("ROW EXCLUSIVE", insertRE.FindStringSubmatch(s)[1], "like the application's own writes")
	case updateRE.MatchString(s):
		return onTable("ROW EXCLUSIVE", updateRE.FindStringSubmatch(s)[1], "row locks on the rows it changes")
	case deleteRE.MatchString(s):
		return onTable("ROW EXCLUSIVE", deleteRE.FindStringSubmatch(s)[1], "row locks on the rows it changes")
	case dropTableRE.MatchString(s):
		return onTable("ACCESS EXCLUSIVE", dropTableRE.FindStringSubmatch(s)[2], "")
	case noTableLockRE.MatchString(s):
		return Lock{Mode: "none", Note: "no table lock"}
	}
	return Lock{Mode: "unknown", Note: "read the statement"}
}

// createdTable is the table st creates, if it is a CREATE TABLE.
func createdTable(st statement) string {
	if m := createTableRE.FindStringSubmatch(strings.TrimSpace(st.SQL)); m != nil {
		return strings.Trim(m[2], `"`)
	}
	return ""
}

// checkConvention returns why f breaks the convention described at the top
// of migrate.go, or nil.
func checkConvention(f file) error {
	created := map[string]bool{}
	for i, st := range f.Up {
		s := strings.TrimSpace(st.SQL)
		where := fmt.Sprintf("%s statement %d (%s)", f.Name, i+1, firstLine(s))
		lock := lockOf(st, created)
		if lock.Mode == "unknown" {
			return fmt.Errorf("%s: the dry run cannot tell what this locks: put -- +wlproj locks … before it", where)
		}
		if m := createIndexRE.FindStringSubmatch(s); m != nil && lock.Table != "" {
			if m[2] == "" || m[3] == "" {
				return fmt.Errorf("%s: an index on an existing table is built CREATE INDEX CONCURRENTLY IF NOT EXISTS", where)
			}
		}
		if strings.Contains(strings.ToUpper(s), "CONCURRENTLY") && !f.NoTx {
			return fmt.Errorf("%s: CONCURRENTLY needs -- +goose NO TRANSACTION", where)
		}
		if f.NoTx {
			// Each statement commits alone: a rerun after a failure must
			// find the earlier ones done and pass over them.
			switch {
			case createObjectRE.MatchString(s) && !createIfNotRE.MatchString(s):
				return fmt.Errorf("%s: in a NO TRANSACTION migration, CREATE needs IF NOT EXISTS", where)
			case addColumnRE.MatchString(s) && addColumnRE.FindStringSubmatch(s)[1] == "":
				return fmt.Errorf("%s: in a NO TRANSACTION migration, ADD COLUMN needs IF NOT EXISTS", where)
			case dropConstrRE.MatchString(s) && dropConstrRE.FindStringSubmatch(s)[2] == "":
				return fmt.Errorf("%s: in a NO TRANSACTION migration, DROP needs IF EXISTS", where)
			case dropIndexRE.MatchString(s) && dropIndexRE.FindStringSubmatch(s)[2] == "":
				return fmt.Errorf("%s: in a NO TRANSACTION migration, DROP INDEX needs IF EXISTS", where)
			}
		} else if lock.Mode == "ACCESS EXCLUSIVE" && ProducerTables[lock.Table] && len(f.Up) > 1 {
			// In a transaction the lock would be held, and the application's
			// writes queued behind it, while later statements wait for theirs.
			return fmt.Errorf("%s: ACCESS EXCLUSIVE on %s in a migration of several statements needs -- +goose NO TRANSACTION", where, lock.Table)
		}
		if t := createdTable(st); t != "" {
			created[t] = true
		}
	}
	return nil
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i] + " …"
	}
	if r := []rune(s); len(r) > 90 {
		s = string(r[:89]) + "…"
	}
	return s
}

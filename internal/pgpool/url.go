package pgpool

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// URLError is a database URL that wlproj refuses: it does not parse, it
// could be read two ways, or it names several hosts unsafely. Its message
// never shows any part of the URL, so that it can be printed as is, before
// anything else has had a chance to redact it.
type URLError struct{ Err error }

func (e *URLError) Error() string { return "DatabaseURL " + e.Err.Error() }
func (e *URLError) Unwrap() error { return e.Err }

// ParseURL parses a database URL, or a keyword/value string, as pgx reads
// it, after CheckURL, and refuses several hosts without
// target_session_attrs=read-write (CheckHosts). Every error is a *URLError.
func ParseURL(databaseURL string) (*pgx.ConnConfig, error) {
	if err := CheckURL(databaseURL); err != nil {
		return nil, err
	}
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return nil, parseError(databaseURL, err)
	}
	if err := CheckHosts(&cfg.Config); err != nil {
		return nil, &URLError{Err: err}
	}
	withoutJIT(cfg.RuntimeParams)
	return cfg, nil
}

// withoutJIT turns Postgres's JIT compilation off for wlproj's sessions,
// unless the URL sets jit itself. Their statements are short and walk
// indexes, but the planner's estimates of a function's rows (1000) and of
// partitions put some over jit_above_cost: the console's status statement,
// 12 ms of work, was estimated at a million and spent 2.7 s compiling,
// holding its snapshot all along (TestNoSessionHoldsTheHorizon). A startup
// parameter costs no round trip and holds for every statement.
func withoutJIT(params map[string]string) {
	if _, set := params["jit"]; !set {
		params["jit"] = "off"
	}
}

// CheckURL refuses a postgres:// URL whose user name, password or database
// name holds a character that changes where pgx cuts it. pgx reads a URL as
// libpq does: the user info ends at the first '@' before the first '/'. A
// password written with a raw '@' ("pa@SECRET") therefore ends early, and
// the rest of it becomes the host, which every connection error, log line
// and health answer then prints. A raw '/' ends the host part before the
// '@', and the rest of the password becomes the database name. A raw '?',
// '#' or space is read by pgx as part of the password but by every URL
// reader (and our redaction) as the end of the host. The error says what
// to percent-encode and shows no part of the URL. A keyword/value string
// ("host=… password=…") is not a URL and is left to pgx.
func CheckURL(databaseURL string) error {
	rest, ok := strings.CutPrefix(databaseURL, "postgresql://")
	if !ok {
		rest, ok = strings.CutPrefix(databaseURL, "postgres://")
	}
	if !ok {
		return nil
	}
	// pgx looks for the user info up to the first '/', the path runs from
	// the '/' that ends the hosts to the query.
	head, _, _ := strings.Cut(rest, "/")
	beforeQuery, query, _ := strings.Cut(rest, "?")
	path := ""
	if i := strings.IndexAny(rest, "/?"); i >= 0 && rest[i] == '/' {
		path = beforeQuery[i:]
	}
	switch userinfo, _, hasUser := strings.Cut(head, "@"); {
	case strings.Count(head, "@") > 1:
		return urlProblem("has more than one '@' before the database name: an '@' in the user name, password or a parameter must be written %40")
	case hasUser && strings.ContainsAny(userinfo, "?# \t\r\n"):
		return urlProblem("has a '?', '#' or space in the user name or password: write them %3F, %23 and %20")
	case strings.Contains(path, "@"):
		return urlProblem("has an '@' after the host: a '/' in the user name or password must be written %2F, " +
			"an '@' in the database name %40")
	}
	for _, param := range strings.Split(query, "&") {
		if param != "" && !strings.Contains(param, "=") {
			return urlProblem("has a query parameter without '=': an '&' in a parameter's value must be written %26")
		}
	}
	return nil
}

func urlProblem(problem string) error { return &URLError{Err: errors.New(problem)} }

// parseError is pgx's parse error without the connection string it quotes:
// pgx masks the password there only on a best-effort basis. What pgx says
// of a URL that passed CheckURL names a port, a parameter or an encoding,
// never the password; what it says of a keyword/value string may quote a
// piece of an unquoted password ("missing = after …"), so it is dropped.
func parseError(databaseURL string, err error) error {
	var pce *pgconn.ParseConfigError
	if !errors.As(err, &pce) {
		return &URLError{Err: errors.New("does not parse")}
	}
	if !strings.HasPrefix(databaseURL, "postgres://") && !strings.HasPrefix(databaseURL, "postgresql://") {
		return urlProblem("does not parse as keyword=value settings (what pgx says is not shown, as it may quote the password): " +
			"check the quoting, a value with spaces goes in single quotes")
	}
	bare := *pce
	bare.ConnString = ""
	return &URLError{Err: errors.New("does not parse: " + strings.TrimPrefix(bare.Error(), "cannot parse ``: "))}
}

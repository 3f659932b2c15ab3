package cli

import (
	"errors"
	"fmt"
	"regexp"

	"github.com/wlproj/wlproj/classify"
	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/internal/pgpool"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/rebuild"
	"github.com/wlproj/wlproj/replay"
	"github.com/wlproj/wlproj/verify"
)

// Exit codes of the operator commands, beyond 0 and kong's own 2 for a flag
// it cannot parse.
const (
	exitFailure = 1 // the database or something else failed
	exitUsage   = 2 // the command is incomplete or a flag value is wrong
	exitRefused = 3 // an audited action looked at the rows and refused; nothing changed
	exitDrift   = 4 // verify: the index differs from the truth
)

// exitError carries an exit code through kong's Run.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// usageError is a flag value the command cannot use.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// commandError gives an operator command's error its exit code and the
// operator's words (cmd's flags for a package's fields), with the database
// credentials scrubbed.
func commandError(cmd dbCommand, err error) error {
	if err == nil {
		return nil
	}
	msg := redact(operatorWords(cmd, err).Error())
	return &exitError{code: codeOf(err), err: redactedError{msg: msg, err: err}}
}

// codeOf is the exit code of an operator command's error.
func codeOf(err error) int {
	var (
		usage   usageError
		field   *bounds.FieldError
		input   *rebuild.InputError
		refused *replay.RefusedError
		rebuilt *rebuild.RefusedError
		busy    *rebuild.BusyError
		repair  *verify.RefusedError
		url     *pgpool.URLError
		unknown *outbox.UnknownProjectionError
		rebase  *outbox.RebaseRefusedError
	)
	switch {
	case errors.Is(err, replay.ErrAuditRequired), errors.Is(err, replay.ErrNoSelector),
		errors.As(err, &usage), errors.As(err, &field), errors.As(err, &input), errors.As(err, &url),
		errors.As(err, &unknown):
		return exitUsage
	case errors.As(err, &refused), errors.As(err, &rebuilt), errors.As(err, &busy), errors.As(err, &repair),
		errors.As(err, &rebase):
		return exitRefused
	}
	return exitFailure
}

// operatorWords says a package's error in the CLI's words: flags, not fields.
func operatorWords(cmd any, err error) error {
	var refused *replay.RefusedError
	var audit *replay.AuditRequiredError
	var repair *verify.RefusedError
	var unknown *outbox.UnknownProjectionError
	var badURL *pgpool.URLError
	switch {
	case errors.As(err, &badURL):
		return renameURL(err, false)
	case errors.As(err, &unknown):
		return fmt.Errorf("--projection: %w", unknown)
	case errors.As(err, &audit):
		return fmt.Errorf("--by and --why are required: say who is %s and why", audit.Doing)
	case errors.Is(err, replay.ErrNoSelector):
		return errors.New("no selector: give --ids, --reason, --projection or --since/--until")
	case errors.As(err, &refused) && refused.Max > 0:
		// Only replay and discard are capped, and both take failed rows.
		return fmt.Errorf("%s refused, nothing changed: %d failed events match, more than --max %d; "+
			"narrow the selector, raise --max, or add --yes", refused.Action, refused.Matching, refused.Max)
	case errors.As(err, &repair):
		return fmt.Errorf("repair refused, nothing changed: %d documents would be repaired, more than --max %d; "+
			"read the samples, then raise --max or add --yes", repair.Queued, repair.Max)
	}
	return renameFields(cmd, err)
}

// redactedError shows a scrubbed message but keeps the chain for errors.Is.
type redactedError struct {
	msg string
	err error
}

func (e redactedError) Error() string { return e.msg }
func (e redactedError) Unwrap() error { return e.err }

// passwordSetting is a password in keyword/value settings or a URL's query
// (password=…, sslpassword=…, the value quoted or not), up to its end.
var passwordSetting = regexp.MustCompile(`(?i)(\b(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&'` + "`" + `]*)`)

// redact removes the database credentials from msg by where they stand: the
// user info of every URL and every password setting. pgx redacts its own
// messages, but only on a best-effort basis. Nothing is masked for looking
// like the password: a password that is a common word ("database") would
// garble every message that holds the word, and a password cut in two by a
// raw '@' would be masked where it stands and printed where the other half
// went; pgpool.CheckURL refuses such a URL before anything can print it.
func redact(msg string) string {
	msg = passwordSetting.ReplaceAllString(msg, "${1}xxxxx")
	return classify.StripURLCredentials(msg)
}

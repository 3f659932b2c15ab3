package rebuild

import (
	"fmt"
	"time"
)

// InputError is a request that cannot be carried out as given: an unknown
// projection, a missing source table or column, a mapping that is not JSON
// or that the engine refuses. Nothing was changed.
type InputError struct {
	Problem string
}

func (e *InputError) Error() string { return e.Problem + "; nothing changed" }

func inputf(format string, args ...any) error {
	return &InputError{Problem: fmt.Sprintf(format, args...)}
}

// BusyError is a second rebuild command while one runs for the projection.
type BusyError struct {
	Projection  string
	PID         int
	Application string
	Client      string
	Since       time.Time
}

func (e *BusyError) Error() string {
	msg := fmt.Sprintf("another rebuild command of projection %q is running", e.Projection)
	if e.PID != 0 {
		msg += fmt.Sprintf(" (Postgres backend pid %d, application_name %q, from %s, since %s)",
			e.PID, e.Application, e.Client, e.Since.UTC().Format(time.RFC3339))
	}
	return msg + "; nothing changed"
}

// RefusedError is a request that looked at the state and found nothing to
// do: --cleanup with nothing to clean, --abort with no open rebuild, a
// re-run that does not match the open rebuild. Nothing was changed.
type RefusedError struct {
	Problem string
}

func (e *RefusedError) Error() string { return e.Problem + "; nothing changed" }

func refusedf(format string, args ...any) error {
	return &RefusedError{Problem: fmt.Sprintf(format, args...)}
}

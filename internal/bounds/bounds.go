// Package bounds checks settings against their accepted ranges. Its errors
// name the setting by its Go field, never by a flag or an environment
// variable: only the CLI knows those, and it renames the field when it
// reports the error (see FieldError).
package bounds

import (
	"cmp"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Range is the inclusive range a setting accepts.
type Range[T cmp.Ordered] struct{ Min, Max T }

// Contains reports whether v is in the range.
func (r Range[T]) Contains(v T) bool { return v >= r.Min && v <= r.Max }

// FieldError is a setting outside its range, or below another setting it
// must not be below.
type FieldError struct {
	// Field is the Go name of the setting, e.g. "BulkSize".
	Field string
	// Value, Min and Max are the offending value and the accepted range;
	// durations stay durations so that the CLI can print them in the unit
	// of its flag.
	Value, Min, Max any
	// Floor, when set, is the field Value must not be below (Min is its value).
	Floor string
	// Problem, when set, replaces the range: "Limit must not be negative".
	Problem string
	// Excludes, when set, are the fields that must not be set with Field,
	// e.g. two ways to authenticate; Problem then says why.
	Excludes []string
}

func (e *FieldError) Error() string {
	if len(e.Excludes) > 0 {
		return e.Field + " cannot be used with " + strings.Join(e.Excludes, " or ") + ": " + e.Problem
	}
	if e.Problem != "" {
		return e.Field + " " + e.Problem
	}
	if e.Floor != "" {
		return fmt.Sprintf("%s=%v must not be below %s=%v", e.Field, e.Value, e.Floor, e.Min)
	}
	return fmt.Sprintf("%s=%v is out of range [%v, %v]", e.Field, e.Value, e.Min, e.Max)
}

// Check returns a *FieldError when v is outside r.
func Check[T cmp.Ordered](field string, v T, r Range[T]) error {
	if r.Contains(v) {
		return nil
	}
	return &FieldError{Field: field, Value: v, Min: r.Min, Max: r.Max}
}

// Invalid returns a *FieldError saying what is wrong with field.
func Invalid(field, problem string, args ...any) error {
	return &FieldError{Field: field, Problem: fmt.Sprintf(problem, args...)}
}

// Exclusive returns a *FieldError for field set together with others, which
// exclude it; why is the reason.
func Exclusive(field, why string, others ...string) error {
	return &FieldError{Field: field, Problem: why, Excludes: others}
}

// NotBelow returns a *FieldError when field's v is below floor's value.
func NotBelow[T cmp.Ordered](field string, v T, floor string, floorValue T) error {
	if v >= floorValue {
		return nil
	}
	return &FieldError{Field: field, Value: v, Floor: floor, Min: floorValue}
}

// First returns the first non-nil error, so that a config reports the first
// bad field in declaration order.
func First(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Rename rewrites a *FieldError in err for the operator's vocabulary: name
// maps a Go field to a flag or variable name, and durations print as plain
// seconds when that name says so (OUTBOX_LEASE_SECONDS, --lease-seconds).
// Other errors pass unchanged.
func Rename(err error, name map[string]string) error {
	var fe *FieldError
	if !errors.As(err, &fe) {
		return err
	}
	out := *fe
	out.Field = cmp.Or(name[fe.Field], fe.Field)
	if fe.Floor != "" {
		out.Floor = cmp.Or(name[fe.Floor], fe.Floor)
	}
	out.Excludes = nil
	for _, f := range fe.Excludes {
		out.Excludes = append(out.Excludes, cmp.Or(name[f], f))
	}
	if strings.HasSuffix(strings.ToLower(out.Field), "seconds") {
		out.Value, out.Min, out.Max = seconds(fe.Value), seconds(fe.Min), seconds(fe.Max)
	}
	return &out
}

func seconds(v any) any {
	if d, ok := v.(time.Duration); ok {
		return d.Seconds()
	}
	return v
}

package classify

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// fromPostgres classifies an error a handler that writes to Postgres (the
// chronicle) meets, by SQLSTATE class: a broken or overloaded server is
// transient; data that does not fit (a constraint, a bad value) and a
// statement the database refuses outright are deterministic. Anything else
// is unknown, transient.
func fromPostgres(pe *pgconn.PgError, err error) *Error {
	msg := "postgres " + pe.Code + ": " + pe.Message
	if pe.Detail != "" {
		msg += " (" + pe.Detail + ")"
	}
	code := pe.Code
	switch {
	case strings.HasPrefix(code, "08"), code == "57P01", code == "57P02", code == "57P03":
		// connection_exception; admin, crash and startup shutdowns.
		return newStatus(Connection, 0, msg, err)
	case code == "57014":
		// query_canceled: statement_timeout or a cancel request.
		return newStatus(Timeout, 0, msg, err)
	case strings.HasPrefix(code, "40"), strings.HasPrefix(code, "53"), strings.HasPrefix(code, "55"),
		strings.HasPrefix(code, "58"), strings.HasPrefix(code, "XX"):
		// Serialization failures and deadlocks, insufficient resources (disk
		// full, too many connections), a lock not available, system errors.
		return newStatus(ServerError, 0, msg, err)
	case strings.HasPrefix(code, "22"), strings.HasPrefix(code, "23"):
		// data_exception, integrity_constraint_violation: this event's data.
		return newStatus(PayloadInvalid, 0, msg, err)
	case strings.HasPrefix(code, "42"):
		// Syntax or access rule violation: a missing table or grant is fixed
		// by a migration or roles.sql, then the events are replayed.
		return newStatus(ClientError, 0, msg, err)
	}
	return newStatus(Unknown, 0, msg, err)
}

// postgresTransport classifies pgconn's own errors, raised before or
// instead of a server answer.
func postgresTransport(err error) (*Error, bool) {
	var ce *pgconn.ConnectError
	switch {
	case errors.As(err, &ce):
		return newStatus(Connection, 0, err.Error(), err), true
	case pgconn.Timeout(err):
		return newStatus(Timeout, 0, err.Error(), err), true
	}
	return nil, false
}

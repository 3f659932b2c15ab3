package classify

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/olivere/elastic/v7"
)

// maxMessage bounds Message: it is stored in last_error and error_history for
// every failed attempt, and engine reasons can quote long field values.
const maxMessage = 512

// RetryAfterMax bounds a Retry-After, so that a bogus value cannot overflow
// or park rows for days.
const RetryAfterMax = 24 * time.Hour

// Error is a classified failure.
type Error struct {
	Class  Class
	Reason string
	// Message is short human text for last_error. It never holds credentials:
	// user info in URLs is removed.
	Message string
	// Status is the HTTP status of the request or bulk item, 0 if none.
	Status int
	// RetryAfter is the delay a 429 response asked for in its Retry-After
	// header, 0 if none.
	RetryAfter time.Duration

	cause error
}

func (e *Error) Error() string {
	if e.Message == "" {
		return e.Reason
	}
	return e.Reason + ": " + e.Message
}

// Unwrap gives the original error, so that callers can still test for
// context.Canceled and the like.
func (e *Error) Unwrap() error { return e.cause }

// New returns an error with the given reason; the class comes from the
// reasons table.
func New(reason, message string) *Error {
	return &Error{Class: ClassOf(reason), Reason: reason, Message: clean(message)}
}

func newStatus(reason string, status int, message string, cause error) *Error {
	e := New(reason, message)
	e.Status = status
	e.cause = cause
	return e
}

// Classify maps any error to a class and a reason. It returns nil for nil, and
// the *Error itself when one is anywhere in err's chain.
func Classify(err error) *Error {
	if err == nil {
		return nil
	}
	var ce *Error
	if errors.As(err, &ce) {
		return ce
	}
	var ee *elastic.Error
	if errors.As(err, &ee) {
		return fromElastic(ee, err)
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return fromPostgres(pe, err)
	}
	if ce, ok := postgresTransport(err); ok {
		return ce
	}
	msg := err.Error()
	if isTLS(err) {
		return newStatus(TLSError, 0, msg, err)
	}
	if isTimeout(err) {
		return newStatus(Timeout, 0, msg, err)
	}
	if isConnection(err) {
		return newStatus(Connection, 0, msg, err)
	}
	return newStatus(Unknown, 0, msg, err)
}

// FromBulkItem classifies one failed item of a bulk response. The handler
// decides beforehand which items are not failures at all (2xx, a 404 on a
// delete, a 409 under external versioning).
func FromBulkItem(status int, errType, errReason string) *Error {
	return fromDetails(status, errType, errReason, nil, nil)
}

func fromElastic(ee *elastic.Error, err error) *Error {
	if ee.Details == nil {
		return fromDetails(ee.Status, "", "", nil, err)
	}
	return fromDetails(ee.Status, ee.Details.Type, ee.Details.Reason, causeReasons(ee.Details.CausedBy, nil), err)
}

// causeReasons collects the reasons of a caused_by chain, which olivere leaves
// as a generic map.
func causeReasons(m map[string]interface{}, acc []string) []string {
	for depth := 0; m != nil && depth < 8; depth++ {
		if r, ok := m["reason"].(string); ok {
			acc = append(acc, r)
		}
		m, _ = m["caused_by"].(map[string]interface{})
	}
	return acc
}

// rejectedTypes are the engines' names for work refused under load:
// Elasticsearch's EsRejectedExecutionException, and OpenSearch's
// OpenSearchRejectedExecutionException, whose prefix OpenSearch strips.
var rejectedTypes = map[string]bool{
	"es_rejected_execution_exception": true,
	"rejected_execution_exception":    true,
}

// mappingTypes are the error types of a document that does not fit the
// mapping; Elasticsearch 8 names the item-level one
// document_parsing_exception, 7.x and OpenSearch mapper_parsing_exception.
var mappingTypes = map[string]bool{
	"mapper_parsing_exception":         true,
	"document_parsing_exception":       true,
	"strict_dynamic_mapping_exception": true,
	"mapper_exception":                 true,
}

var parseTypes = map[string]bool{
	"parse_exception":           true,
	"x_content_parse_exception": true,
	"json_parse_exception":      true,
	"json_e_o_f_exception":      true,
	"not_x_content_exception":   true,
}

// mappingHints are fragments of illegal_argument_exception reasons that the
// engine gives when a document or a mapping update conflicts with the index
// mapping, e.g. "mapper [title] cannot be changed from type [text] to
// [long]" or "Limit of total fields [1000] has been exceeded".
var mappingHints = []string{
	"mapper [",
	"mapping definition",
	"mapping update",
	"mapping set to strict",
	"failed to parse field",
	"failed to parse date field",
	"limit of total fields",
	"limit of mapping depth",
	"limit of nested fields",
	"cannot be changed from type",
	"can't merge",
	"metadata field",
}

func fromDetails(status int, typ, reason string, causes []string, err error) *Error {
	msg := describe(status, typ, reason)
	switch {
	case status == http.StatusTooManyRequests || rejectedTypes[typ]:
		if status == 0 {
			status = http.StatusTooManyRequests
		}
		return newStatus(RateLimited, status, msg, err)
	case status >= 500:
		return newStatus(ServerError, status, msg, err)
	case status == http.StatusUnauthorized || (status == http.StatusForbidden && typ == "security_exception"):
		return newStatus(AuthError, status, msg, err)
	case mappingTypes[typ]:
		return newStatus(MappingError, status, msg, err)
	case typ == "illegal_argument_exception" && aboutMapping(reason, causes):
		return newStatus(MappingError, status, msg, err)
	case parseTypes[typ]:
		return newStatus(ParseError, status, msg, err)
	case status == http.StatusRequestTimeout:
		return newStatus(Timeout, status, msg, err)
	case status >= 400:
		return newStatus(ClientError, status, msg, err)
	}
	return newStatus(Unknown, status, msg, err)
}

func aboutMapping(reason string, causes []string) bool {
	for _, r := range append([]string{reason}, causes...) {
		r = strings.ToLower(r)
		for _, h := range mappingHints {
			if strings.Contains(r, h) {
				return true
			}
		}
	}
	return false
}

func describe(status int, typ, reason string) string {
	var b strings.Builder
	b.WriteString("elasticsearch")
	if status != 0 {
		fmt.Fprintf(&b, " %d", status)
	}
	if typ != "" {
		b.WriteString(" " + typ)
	}
	if reason != "" {
		b.WriteString(": " + reason)
	}
	return b.String()
}

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	// Covers *url.Error, *net.OpError and os.ErrDeadlineExceeded.
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// isTLS reports a failed handshake: the engine's certificate not trusted or
// not for its host, an alert from the engine, or TLS to a plain-http port.
func isTLS(err error) bool {
	var (
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		record   tls.RecordHeaderError
		alert    tls.AlertError
	)
	return errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &hostname) ||
		errors.As(err, &invalid) || errors.As(err, &record) || errors.As(err, &alert) ||
		// net/http's own error for an https URL on a plain-http port.
		strings.Contains(err.Error(), "server gave HTTP response to HTTPS client")
}

var connErrs = []error{
	elastic.ErrNoClient,
	syscall.ECONNREFUSED,
	syscall.ECONNRESET,
	syscall.ECONNABORTED,
	syscall.EPIPE,
	syscall.EHOSTUNREACH,
	syscall.ENETUNREACH,
	io.EOF,
	io.ErrUnexpectedEOF,
	net.ErrClosed,
}

func isConnection(err error) bool {
	for _, target := range connErrs {
		if errors.Is(err, target) {
			return true
		}
	}
	var oe *net.OpError
	if errors.As(err, &oe) {
		return true
	}
	var de *net.DNSError
	return errors.As(err, &de)
}

// userInfo matches the credentials part of a URL, e.g. "http://u:p@".
var userInfo = regexp.MustCompile(`([a-zA-Z][a-zA-Z0-9+.-]*://)[^/?#@\s]*@`)

// StripURLCredentials removes the user info of every URL in s.
func StripURLCredentials(s string) string { return userInfo.ReplaceAllString(s, "${1}") }

// clean removes credentials and bounds the length, so that a message can be
// stored and logged as is.
func clean(s string) string {
	s = StripURLCredentials(s)
	s = strings.TrimSpace(s)
	if len(s) <= maxMessage {
		return s
	}
	cut := maxMessage
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

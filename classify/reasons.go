package classify

// Class says whether retrying can help.
type Class string

const (
	// Transient errors are retried with backoff, up to the attempt cap.
	Transient Class = "transient"
	// Deterministic errors fail the same way every time: straight to failed.
	Deterministic Class = "deterministic"
)

// Reasons, as they appear in error_reason, metrics labels and the runbook.
const (
	RateLimited = "rate_limited"
	ServerError = "server_error"
	Timeout     = "timeout"
	Connection  = "connection"
	// AuthError is a 401 (or a 403 security_exception): the engine refused
	// the credentials. It is the operator's to fix, not the event's, so it
	// is retried like a dependency failure and nothing is lost meanwhile.
	AuthError = "auth_error"
	// TLSError is a failed TLS handshake with the engine: a certificate the
	// CA file does not vouch for, a wrong host name, or https against a
	// plain-http port. Also the operator's to fix.
	TLSError          = "tls_error"
	MappingError      = "mapping_error"
	ParseError        = "parse_error"
	PayloadInvalid    = "payload_invalid"
	UnknownProjection = "unknown_projection"
	ClientError       = "client_error"
	// VersionReused is an event whose event_version another event of the
	// same document already carries: the producer broke the contract that
	// versions of a document increase.
	VersionReused = "version_reused"
	Unknown       = "unknown"
	// Stuck is set by the reclaimer when a row kept getting stuck in
	// processing until it ran out of attempts.
	Stuck = "stuck"
)

var reasonClass = map[string]Class{
	RateLimited:       Transient,
	ServerError:       Transient,
	Timeout:           Transient,
	Connection:        Transient,
	AuthError:         Transient,
	TLSError:          Transient,
	MappingError:      Deterministic,
	ParseError:        Deterministic,
	PayloadInvalid:    Deterministic,
	UnknownProjection: Deterministic,
	ClientError:       Deterministic,
	VersionReused:     Deterministic,
	Unknown:           Transient,
	Stuck:             Transient,
}

// Reasons lists every reason in a stable order.
var Reasons = []string{RateLimited, ServerError, Timeout, Connection, AuthError, TLSError, MappingError, ParseError,
	PayloadInvalid, UnknownProjection, ClientError, VersionReused, Unknown, Stuck}

// ClassOf returns the class of a reason; unknown reasons are transient.
func ClassOf(reason string) Class {
	if c, ok := reasonClass[reason]; ok {
		return c
	}
	return Transient
}

// AutoReplayable lists the reasons the auto-replay policy may revive once the
// engine is healthy again: failures of the dependency (or of how wlproj
// reaches it), never of the data.
var AutoReplayable = []string{RateLimited, ServerError, Timeout, Connection, AuthError, TLSError}

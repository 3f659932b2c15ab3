package cli

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/wlproj/wlproj/console"
	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/leader"
)

// consoleFlags are the operator console's settings; runCmd embeds them.
// The console is off unless OUTBOX_CONSOLE_USERS_FILE is set: there is no
// console without sign-in.
type consoleFlags struct {
	ConsoleUsersFile      string        `name:"console-users-file" help:"htpasswd file of the console's users, bcrypt only (htpasswd -B); setting it turns the operator console on." env:"OUTBOX_CONSOLE_USERS_FILE" type:"existingfile" field:"UsersFile"`
	ConsoleReadOnlyUsers  string        `name:"console-readonly-users" help:"Comma list of users of the users file who may look but not act." env:"OUTBOX_CONSOLE_READONLY_USERS" field:"ReadOnlyUsers"`
	ConsoleSessionKeyFile string        `name:"console-session-key-file" help:"File of at least 32 secret bytes that sign and encrypt console sessions; give every replica the same one (default: a random key per process, sessions end with it)." env:"OUTBOX_CONSOLE_SESSION_KEY_FILE" type:"existingfile" field:"SessionKeyFile"`
	ConsoleSessionTTL     time.Duration `name:"console-session-ttl" help:"How long a console sign-in lasts [${console_session_ttl_range}]." env:"OUTBOX_CONSOLE_SESSION_TTL" default:"${console_session_ttl}" field:"SessionTTL"`
	ConsoleAddr           string        `name:"console-addr" help:"Bind address of the console's own port." env:"OUTBOX_CONSOLE_ADDR" default:"${console_addr}" field:"Addr"`
	ConsolePort           int           `name:"console-port" help:"The console's own port; 0 serves it under /console/ on the HTTP port [${console_port_range}]." env:"OUTBOX_CONSOLE_PORT" default:"0" field:"Port"`
	ConsoleTLSCertFile    string        `name:"console-tls-cert-file" help:"PEM certificate to serve the console's own port over TLS (with OUTBOX_CONSOLE_TLS_KEY_FILE)." env:"OUTBOX_CONSOLE_TLS_CERT_FILE" type:"existingfile" field:"TLSCertFile"`
	ConsoleTLSKeyFile     string        `name:"console-tls-key-file" help:"PEM private key of OUTBOX_CONSOLE_TLS_CERT_FILE." env:"OUTBOX_CONSOLE_TLS_KEY_FILE" type:"existingfile" field:"TLSKeyFile"`
}

// config is the console's Config; a port equal to the HTTP port means the
// HTTP listener, as for the metrics port.
func (f *consoleFlags) config(httpPort int, maxProcessing time.Duration) console.Config {
	port := f.ConsolePort
	if port == httpPort {
		port = 0
	}
	var readOnly []string
	for name := range strings.SplitSeq(f.ConsoleReadOnlyUsers, ",") {
		if name = strings.TrimSpace(name); name != "" {
			readOnly = append(readOnly, name)
		}
	}
	return console.Config{UsersFile: f.ConsoleUsersFile, ReadOnlyUsers: readOnly, SessionKeyFile: f.ConsoleSessionKeyFile,
		SessionTTL: f.ConsoleSessionTTL, Addr: f.ConsoleAddr, Port: port,
		TLSCertFile: f.ConsoleTLSCertFile, TLSKeyFile: f.ConsoleTLSKeyFile, MaxProcessing: maxProcessing}
}

// validate refuses console settings without a users file (the console
// would be off, silently), then checks the rest.
func (f *consoleFlags) validate(httpPort int) error {
	if f.ConsoleUsersFile == "" {
		for _, s := range []struct {
			field string
			set   bool
		}{
			{"Port", f.ConsolePort != 0}, {"ReadOnlyUsers", f.ConsoleReadOnlyUsers != ""},
			{"SessionKeyFile", f.ConsoleSessionKeyFile != ""}, {"TLSCertFile", f.ConsoleTLSCertFile != ""},
			{"TLSKeyFile", f.ConsoleTLSKeyFile != ""},
		} {
			if s.set {
				return bounds.Invalid(s.field, "is set, but the console is off: set OUTBOX_CONSOLE_USERS_FILE to turn it on")
			}
		}
		return nil
	}
	return f.config(httpPort, 0).Validate()
}

// runningConsole is a replica's console; nil when it is off, and then its
// methods do nothing.
type runningConsole struct{ *console.Console }

// startConsole starts the replica's console, serving its own port if it
// has one.
func (c *runCmd) startConsole(pool *pgxpool.Pool, elector *leader.Elector, log zerolog.Logger) (*runningConsole, error) {
	if c.ConsoleUsersFile == "" {
		return nil, nil
	}
	con, err := console.New(c.config(c.HTTPPort, seconds(c.MaxProcessingSeconds)), console.Deps{
		Pool: pool, State: elector.State, LeaderName: c.LeaderName, Projections: projectionNames(), Log: log})
	if err != nil {
		return nil, err
	}
	con.Serve()
	where := "http://" + c.HTTPAddr + ":" + strconv.Itoa(c.HTTPPort) + console.Prefix
	if addr := con.Addr(); addr != "" {
		where = addr
	}
	log.Info().Str("console", where).Msg("operator console on")
	return &runningConsole{con}, nil
}

// routes are what the console adds to the HTTP listener: nothing when it
// is off or has its own port.
func (r *runningConsole) routes() map[string]http.Handler {
	if r == nil || r.Addr() != "" {
		return nil
	}
	return map[string]http.Handler{console.Prefix: r.Handler()}
}

func (r *runningConsole) close() {
	if r != nil {
		r.Close()
	}
}

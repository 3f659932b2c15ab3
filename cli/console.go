package cli

import (
	"strings"
	"time"

	"github.com/wlproj/wlproj/console"
	"github.com/wlproj/wlproj/internal/bounds"
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
	PolicyFile            string        `name:"policy-file" help:"Policy file (YAML) mapping console users and groups to roles: which projections and scope keys each may see, which actions take; without it operators do everything and read-only users look." env:"OUTBOX_POLICY_FILE" type:"existingfile" field:"PolicyFile"`
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
		TLSCertFile: f.ConsoleTLSCertFile, TLSKeyFile: f.ConsoleTLSKeyFile, MaxProcessing: maxProcessing,
		PolicyFile: f.PolicyFile}
}

// validate refuses console settings without a users file: the console
// would be off, silently. The replica checks the rest.
func (f *consoleFlags) validate() error {
	if f.ConsoleUsersFile != "" {
		return nil
	}
	for _, s := range []struct {
		field string
		set   bool
	}{
		{"Port", f.ConsolePort != 0}, {"ReadOnlyUsers", f.ConsoleReadOnlyUsers != ""},
		{"SessionKeyFile", f.ConsoleSessionKeyFile != ""}, {"TLSCertFile", f.ConsoleTLSCertFile != ""},
		{"TLSKeyFile", f.ConsoleTLSKeyFile != ""}, {"PolicyFile", f.PolicyFile != ""},
	} {
		if s.set {
			return bounds.Invalid(s.field, "is set, but the console is off: set OUTBOX_CONSOLE_USERS_FILE to turn it on")
		}
	}
	return nil
}

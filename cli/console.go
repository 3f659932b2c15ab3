package cli

import (
	"strings"
	"time"

	"github.com/wlproj/wlproj/console"
	"github.com/wlproj/wlproj/internal/bounds"
)

// consoleFlags are the operator console's settings; runCmd embeds them.
// The console is off unless OUTBOX_CONSOLE_USERS_FILE or
// OUTBOX_CONSOLE_OIDC_ISSUER is set: there is no console without sign-in.
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
	consoleOIDCFlags
}

// consoleOIDCFlags are the console's single sign-on settings (OpenID
// Connect).
type consoleOIDCFlags struct {
	ConsoleOIDCIssuer           string `name:"console-oidc-issuer" help:"Issuer URL of an OpenID provider to sign in to the console with; setting it turns the console on (https://, or http:// on a loopback address)." env:"OUTBOX_CONSOLE_OIDC_ISSUER" field:"OIDCIssuer"`
	ConsoleOIDCClientID         string `name:"console-oidc-client-id" help:"The console's client id at the OpenID provider." env:"OUTBOX_CONSOLE_OIDC_CLIENT_ID" field:"OIDCClientID"`
	ConsoleOIDCClientSecretFile string `name:"console-oidc-client-secret-file" help:"File holding the console's client secret at the OpenID provider." env:"OUTBOX_CONSOLE_OIDC_CLIENT_SECRET_FILE" type:"existingfile" field:"OIDCClientSecretFile"`
	ConsoleOIDCRedirectURL      string `name:"console-oidc-redirect-url" help:"The console's public URL followed by ${console_oidc_callback}, as registered at the provider." env:"OUTBOX_CONSOLE_OIDC_REDIRECT_URL" field:"OIDCRedirectURL"`
	ConsoleOIDCUsernameClaim    string `name:"console-oidc-username-claim" help:"ID token claim that names the user." env:"OUTBOX_CONSOLE_OIDC_USERNAME_CLAIM" default:"${console_oidc_username_claim}" field:"OIDCUsernameClaim"`
	ConsoleOIDCGroupsClaim      string `name:"console-oidc-groups-claim" help:"ID token claim that lists the user's groups." env:"OUTBOX_CONSOLE_OIDC_GROUPS_CLAIM" default:"${console_oidc_groups_claim}" field:"OIDCGroupsClaim"`
	ConsoleOIDCScopes           string `name:"console-oidc-scopes" help:"Comma list of the scopes asked for; openid is always asked." env:"OUTBOX_CONSOLE_OIDC_SCOPES" default:"${console_oidc_scopes}" field:"OIDCScopes"`
	ConsoleOIDCProviderName     string `name:"console-oidc-provider-name" help:"Name of the provider on the sign-in button (default: the issuer's host)." env:"OUTBOX_CONSOLE_OIDC_PROVIDER_NAME" field:"OIDCProviderName"`
}

// config is the console's Config; a port equal to the HTTP port means the
// HTTP listener, as for the metrics port.
func (f *consoleFlags) config(httpPort int, maxProcessing time.Duration) console.Config {
	port := f.ConsolePort
	if port == httpPort {
		port = 0
	}
	o := f.consoleOIDCFlags
	return console.Config{UsersFile: f.ConsoleUsersFile, ReadOnlyUsers: commaList(f.ConsoleReadOnlyUsers),
		SessionKeyFile: f.ConsoleSessionKeyFile, SessionTTL: f.ConsoleSessionTTL, Addr: f.ConsoleAddr, Port: port,
		TLSCertFile: f.ConsoleTLSCertFile, TLSKeyFile: f.ConsoleTLSKeyFile, MaxProcessing: maxProcessing,
		OIDCIssuer: o.ConsoleOIDCIssuer, OIDCClientID: o.ConsoleOIDCClientID, OIDCClientSecretFile: o.ConsoleOIDCClientSecretFile,
		OIDCRedirectURL: o.ConsoleOIDCRedirectURL, OIDCUsernameClaim: o.ConsoleOIDCUsernameClaim,
		OIDCGroupsClaim: o.ConsoleOIDCGroupsClaim, OIDCScopes: commaList(o.ConsoleOIDCScopes),
		OIDCProviderName: o.ConsoleOIDCProviderName,
		PolicyFile:       f.PolicyFile}
}

// commaList is the non-empty items of a comma list, trimmed.
func commaList(s string) []string {
	var items []string
	for item := range strings.SplitSeq(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			items = append(items, item)
		}
	}
	return items
}

// validate refuses console settings without a users file or an OpenID
// issuer: the console would be off, silently. The replica checks the rest
// (the single sign-on settings without an issuer among them).
func (f *consoleFlags) validate() error {
	if f.ConsoleUsersFile != "" || f.ConsoleOIDCIssuer != "" {
		return nil
	}
	for _, s := range []struct {
		field string
		set   bool
	}{
		{"Port", f.ConsolePort != 0}, {"ReadOnlyUsers", f.ConsoleReadOnlyUsers != ""},
		{"SessionKeyFile", f.ConsoleSessionKeyFile != ""}, {"TLSCertFile", f.ConsoleTLSCertFile != ""},
		{"TLSKeyFile", f.ConsoleTLSKeyFile != ""}, {"OIDCClientID", f.ConsoleOIDCClientID != ""},
		{"OIDCClientSecretFile", f.ConsoleOIDCClientSecretFile != ""}, {"OIDCRedirectURL", f.ConsoleOIDCRedirectURL != ""},
		{"OIDCProviderName", f.ConsoleOIDCProviderName != ""}, {"PolicyFile", f.PolicyFile != ""},
	} {
		if s.set {
			return bounds.Invalid(s.field, "is set, but the console is off: set OUTBOX_CONSOLE_USERS_FILE or OUTBOX_CONSOLE_OIDC_ISSUER to turn it on")
		}
	}
	return nil
}

package policy

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"os/user"
	"slices"
)

// How an actor signed in.
const (
	AuthPassword = "password" // the console's htpasswd file
	AuthOIDC     = "oidc"     // OpenID Connect
	AuthOS       = "os"       // the CLI: the OS user who ran it, and its --by
	AuthNone     = "none"     // the daemon's own scheduled work
)

// What an actor acts through.
const (
	ViaConsole   = "console"
	ViaCLI       = "cli"
	ViaScheduled = "scheduled"
)

// Actor is who is behind a request or an action. It is what an audit row
// records beside its by, and what the console's policy checks read.
type Actor struct {
	User   string   `json:"user"`
	Groups []string `json:"groups,omitempty"`
	Roles  []string `json:"roles,omitempty"`
	// Scopes are the scope patterns the actor's roles grant, for the
	// record; Grants decide.
	Scopes []string `json:"scopes,omitempty"`
	Auth   string   `json:"auth"`
	Via    string   `json:"via"`
	// OSUser is the account that ran the CLI; empty elsewhere.
	OSUser    string `json:"os_user,omitempty"`
	Remote    string `json:"remote,omitempty"`
	RequestID string `json:"request_id"`
	// Grants are what the actor may do; nil for the CLI and scheduled work,
	// which the policy does not restrict (see Unrestricted).
	Grants *Grants `json:"-"`
}

// NewRequestID is a random id of 16 characters for one request or command.
func NewRequestID() string {
	b := make([]byte, 10)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b)
}

// CLI is the actor of a command: by as given (--by), the OS user beside it.
// The CLI holds the database's credentials, which are the boundary there:
// the policy file governs the console, not someone who can run SQL.
func CLI(by string) *Actor {
	a := &Actor{User: by, Auth: AuthOS, Via: ViaCLI, RequestID: NewRequestID()}
	if u, err := user.Current(); err == nil {
		a.OSUser = u.Username
	}
	return a
}

// Scheduled is the actor of the daemon's own work on a schedule (the
// auto-replay, the auto-archive, a scheduled verify), named by.
func Scheduled(by string) *Actor {
	return &Actor{User: by, Auth: AuthNone, Via: ViaScheduled, RequestID: NewRequestID()}
}

// WithGrants sets a's grants and the roles and scopes recorded from them.
func (a *Actor) WithGrants(g *Grants) *Actor {
	a.Grants = g
	a.Roles, a.Scopes = g.roleNames(), g.scopePatterns()
	return a
}

type actorKey struct{}

// With returns ctx carrying a.
func With(ctx context.Context, a *Actor) context.Context {
	return context.WithValue(ctx, actorKey{}, a)
}

// From is the actor ctx carries, nil if none.
func From(ctx context.Context) *Actor {
	a, _ := ctx.Value(actorKey{}).(*Actor)
	return a
}

func sortedUnique(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}

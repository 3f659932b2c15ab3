// Command dex is Dex's OpenID provider, from Dex's own server package, for
// the console's sign-in tests (internal/testkit/dex starts it). It is its
// own module so that the project's `go test ./...` never builds it, and it
// has its own main rather than Dex's cmd/dex because cmd/dex serves Dex's
// gRPC API from the nested module github.com/dexidp/dex/api/v2, whose
// version at this Dex commit the module proxy does not serve (and a module
// zip leaves nested modules out), while the proxy's v2.4.0 lacks types the
// API server needs. The tests need the OpenID side alone: discovery, the
// password login form, codes, tokens and keys, all of which are
// github.com/dexidp/dex/server.
//
// Usage: dex CONFIG.json, with the config testkit/dex writes (see config).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/dexidp/dex/server"
	"github.com/dexidp/dex/server/connectors"
	"github.com/dexidp/dex/server/signer"
	"github.com/dexidp/dex/storage"
	"github.com/dexidp/dex/storage/memory"
)

// config is what testkit/dex writes: the subset of Dex's own config file
// the tests use, with the same field names.
type config struct {
	Issuer          string           `json:"issuer"`
	Addr            string           `json:"addr"`
	StaticClients   []storage.Client `json:"staticClients"`
	StaticPasswords []password       `json:"staticPasswords"`
}

type password struct {
	Email    string   `json:"email"`
	Hash     string   `json:"hash"`
	Username string   `json:"username"`
	UserID   string   `json:"userID"`
	Groups   []string `json:"groups"`
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: dex CONFIG.json")
		os.Exit(2)
	}
	if err := run(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "dex:", err)
		os.Exit(1)
	}
}

func run(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var c config
	if err := json.Unmarshal(b, &c); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv, err := newServer(ctx, c, logger)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.Addr)
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = hs.Close()
	}()
	logger.Info("listening", "addr", ln.Addr().String(), "issuer", c.Issuer)
	if err := hs.Serve(ln); err != nil && err != http.ErrServerClosed {
		return err
	}
	return nil
}

// newServer is Dex with in-memory storage, the static clients, and the
// password database holding the static passwords, as cmd/dex builds it for
// `storage: memory` and `enablePasswordDB: true`.
func newServer(ctx context.Context, c config, logger *slog.Logger) (*server.Server, error) {
	s := memory.New(logger)
	s = storage.WithStaticClients(s, c.StaticClients)
	passwords := make([]storage.Password, len(c.StaticPasswords))
	for i, p := range c.StaticPasswords {
		passwords[i] = storage.Password{Email: p.Email, Hash: []byte(p.Hash), Username: p.Username,
			UserID: p.UserID, Groups: p.Groups}
	}
	s = storage.WithStaticPasswords(s, passwords, logger)
	s = storage.WithStaticConnectors(s, []storage.Connector{
		{ID: connectors.LocalConnector, Name: "Email", Type: connectors.LocalConnector},
	})
	idTokensValidFor := 24 * time.Hour
	sign, err := (&signer.LocalConfig{KeysRotationPeriod: "6h"}).Open(ctx, s, idTokensValidFor, time.Now, logger)
	if err != nil {
		return nil, fmt.Errorf("open the signer: %w", err)
	}
	return server.NewServer(ctx, server.Config{
		Issuer:             c.Issuer,
		Storage:            s,
		Logger:             logger,
		Now:                time.Now,
		Signer:             sign,
		IDTokensValidFor:   idTokensValidFor,
		SkipApprovalScreen: true,
	})
}

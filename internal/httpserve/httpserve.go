// Package httpserve is the listen, serve and shutdown of wlproj's HTTP
// listeners (health and metrics, the console's own port), written once.
package httpserve

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/wlproj/wlproj/internal/startstop"
)

// shutdownGrace is how long Stop lets requests in flight finish.
const shutdownGrace = time.Second

// Server serves srv on a listener bound by Listen, between Start and Stop
// (a startstop.Service).
type Server struct {
	srv    *http.Server
	ln     net.Listener
	runner startstop.Runner
}

// Listen binds host:port, over TLS with cfg when it is not nil, so that a
// taken port fails now rather than when serving starts.
func Listen(host string, port int, srv *http.Server, cfg *tls.Config) (*Server, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return nil, err
	}
	if cfg != nil {
		ln = tls.NewListener(ln, cfg)
	}
	return &Server{srv: srv, ln: ln}, nil
}

// Addr is the bound address, host:port.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Start serves in the background until Stop or ctx ends.
func (s *Server) Start(ctx context.Context) error {
	s.runner.Run(ctx, func(ctx context.Context) {
		served := make(chan struct{})
		go func() {
			defer close(served)
			_ = s.srv.Serve(s.ln)
		}()
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), shutdownGrace)
		defer cancel()
		_ = s.srv.Shutdown(shutdown)
		<-served
	})
	return nil
}

// Stop shuts the server down, letting requests in flight finish for a
// second, and returns once it has stopped; a server never started just
// releases its listener.
func (s *Server) Stop() {
	if !s.runner.Running() {
		_ = s.ln.Close()
		return
	}
	s.runner.Stop()
}

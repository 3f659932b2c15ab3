package leader

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wlproj/wlproj/outbox"
)

// Server is the Postgres server a session reached, as it describes itself.
type Server struct {
	// Addr is the server's own address and port (inet_server_addr,
	// inet_server_port): for people, since through NAT or a second name it
	// is not the host DatabaseURL lists.
	Addr string
	// Primary is false on a standby.
	Primary bool
	// Timeline is the timeline a primary writes on; 0 on a standby.
	Timeline int64
	// StartedAt is when the server's postmaster started. With the port it
	// tells two servers apart: a standby and its primary share everything
	// else a session can read without a grant, and one server reached
	// under two names or addresses (::1 and 127.0.0.1) shares these.
	StartedAt time.Time

	port int
}

// Same reports whether s and o are one server.
func (s Server) Same(o Server) bool { return s.port == o.port && s.StartedAt.Equal(o.StartedAt) }

func (s Server) String() string { return s.Addr + " (" + s.what() + ")" }

// what says what s is, without its address.
func (s Server) what() string {
	role := "a standby"
	if s.Primary {
		role = "a primary on timeline " + strconv.FormatInt(s.Timeline, 10)
	}
	return role + ", up since " + s.StartedAt.UTC().Format(time.RFC3339Nano)
}

// as names s by the host a URL lists, and by its own address too when that
// differs.
func (s Server) as(host string) string {
	if host == s.Addr {
		return s.String()
	}
	return host + " (server " + s.Addr + ", " + s.what() + ")"
}

// ServerSQL is what a session reads to describe its server: one short
// statement, no table.
var ServerSQL = `
SELECT coalesce(host(inet_server_addr()), 'local'), coalesce(inet_server_port(), 0), NOT pg_is_in_recovery(),
       CASE WHEN pg_is_in_recovery() THEN 0 ELSE ` + outbox.TimelineSQL + ` END, pg_postmaster_start_time()`

// querier is a *pgx.Conn or a pool's connection.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func readServer(ctx context.Context, q querier) (Server, error) {
	var s Server
	var host string
	err := q.QueryRow(ctx, ServerSQL).Scan(&host, &s.port, &s.Primary, &s.Timeline, &s.StartedAt)
	s.Addr = net.JoinHostPort(host, strconv.Itoa(s.port))
	return s, err
}

// PoolServers makes an Elector.PoolServers of pool: the servers of its idle
// connections, or, when none is idle, of one it acquires, which a new
// connection makes where DatabaseURL's host list leads now. A statement per
// connection, every ServerCheckInterval: nothing per claim.
func PoolServers(pool *pgxpool.Pool) func(context.Context) ([]Server, error) {
	return func(ctx context.Context) ([]Server, error) {
		conns := pool.AcquireAllIdle(ctx)
		if len(conns) == 0 {
			c, err := pool.Acquire(ctx)
			if err != nil {
				return nil, err
			}
			conns = append(conns, c)
		}
		var servers []Server
		var errs []error
		for _, c := range conns {
			s, err := readServer(ctx, c)
			c.Release()
			if err != nil {
				errs = append(errs, err)
				continue
			}
			servers = append(servers, s)
		}
		return servers, errors.Join(errs...)
	}
}

// probe is what one host of DatabaseURL said it is.
type probe struct {
	host   string // as DatabaseURL lists it
	server Server
	err    error
}

// probeHosts asks every host DatabaseURL lists, each on a short connection
// of its own and all at once, what server it is. A host that does not
// answer before ctx ends has err set: down is not a second primary.
func (e *Elector) probeHosts(ctx context.Context) ([]probe, error) {
	base, err := pgx.ParseConfig(e.cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	base.RuntimeParams["application_name"] = probeSessionPrefix + e.cfg.WorkerID
	base.RuntimeParams["statement_timeout"] = strconv.Itoa(int(e.cfg.CheckTimeout.Milliseconds()))
	configs := hostConfigs(base)
	probes := make([]probe, len(configs))
	var wg sync.WaitGroup
	for i, cfg := range configs {
		probes[i].host = net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			probes[i].server, probes[i].err = probeHost(ctx, cfg)
		}()
	}
	wg.Wait()
	return probes, nil
}

func probeHost(ctx context.Context, cfg *pgx.ConnConfig) (Server, error) {
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return Server{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return readServer(ctx, conn)
}

// hostConfigs splits base into one config per listed host, each keeping
// that host's own fallbacks (sslmode=prefer tries TLS, then plain) and
// accepting any server, standbys included.
func hostConfigs(base *pgx.ConnConfig) []*pgx.ConnConfig {
	all := append([]*pgconn.FallbackConfig{{Host: base.Host, Port: base.Port, TLSConfig: base.TLSConfig}}, base.Fallbacks...)
	var configs []*pgx.ConnConfig
	for i := 0; i < len(all); {
		j := i + 1
		for j < len(all) && all[j].Host == all[i].Host && all[j].Port == all[i].Port {
			j++
		}
		c := base.Copy()
		c.Host, c.Port, c.TLSConfig, c.Fallbacks = all[i].Host, all[i].Port, all[i].TLSConfig, all[i+1:j]
		c.ValidateConnect = nil
		configs = append(configs, c)
		i = j
	}
	return configs
}

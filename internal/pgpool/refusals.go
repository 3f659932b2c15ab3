package pgpool

import (
	"context"
	"errors"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// refusalCodes are the errors with which pgx, like libpq, stops trying the
// hosts of a URL: the password refused, the database unknown, no CONNECT
// privilege. A standby answers them for a role, password, database or
// grant that the primary has committed and the standby has flushed but not
// applied yet (synchronous_commit=on waits for the flush only), or never
// will (a delayed standby), so that a standby listed before the primary
// would stop every new connection.
var refusalCodes = map[string]bool{"28P01": true, "3D000": true, "42501": true}

// refusalMemory is how long a host that refused a session is tried after
// the others. It is only ever moved, never left out: if every other host
// fails, it is still tried (a promoted standby that had refused).
const refusalMemory = time.Minute

// hosts is what this process knows of the hosts of its multi-host URLs,
// shared by the lock connection, the pools and the CLI's connections, so
// that one of them meeting a refusal spares the others.
var hosts = hostMemory{refused: map[string]time.Time{}, names: map[string]string{}, surveyed: map[string]bool{}}

type hostMemory struct {
	mu       sync.Mutex
	refused  map[string]time.Time // host:port as the URL names it → its last refusal
	names    map[string]string    // an address a host resolved to → the host as named
	surveyed map[string]bool      // a URL's host list → Connect has tried it
	survey   sync.Mutex           // one survey at a time (surveyOnce)
}

// Connect opens a connection as pgx.ConnectConfig does, but goes on to the
// next hosts when one refuses the session (refusalCodes), where pgx would
// stop, and tries the hosts that refused lately after the others. The
// error, when every host failed, holds each attempt's.
func Connect(ctx context.Context, cfg *pgx.ConnConfig) (*pgx.Conn, error) {
	if len(Hosts(&cfg.Config)) < 2 {
		return pgx.ConnectConfig(ctx, cfg)
	}
	defer hosts.markSurveyed(&cfg.Config)
	rest := cfg.Copy()
	arrange(&rest.Config)
	var errs []error
	for {
		var stoppedAt string
		attempt := rest.Copy()
		learn(&attempt.Config, func(host string) { stoppedAt = host })
		conn, err := pgx.ConnectConfig(ctx, attempt)
		if err == nil {
			return conn, nil
		}
		errs = append(errs, err)
		if stoppedAt == "" || ctx.Err() != nil || !after(&rest.Config, stoppedAt) {
			if len(errs) == 1 {
				return nil, err
			}
			return nil, errors.Join(errs...)
		}
	}
}

// BeforeConnect is the BeforeConnect of a pool of cfg's connections
// (pgxpool's, or database/sql's through stdlib.OptionBeforeConnect): each
// connection records the hosts that refuse it and tries them after the
// others. A pool's connection cannot go on past a refusal, so the first one
// of the process waits for Connect to survey the hosts, and goes to the
// host the survey reached: a host that never answers costs it one wait,
// not two. With one host it does nothing.
func BeforeConnect(cfg *pgx.ConnConfig) func(context.Context, *pgx.ConnConfig) error {
	raw := cfg.Copy()
	if len(Hosts(&raw.Config)) < 2 {
		return func(context.Context, *pgx.ConnConfig) error { return nil }
	}
	return func(ctx context.Context, cc *pgx.ConnConfig) error {
		learn(&cc.Config, nil)
		if reached := hosts.surveyOnce(ctx, raw); reached != "" {
			only(&cc.Config, reached)
		}
		arrange(&cc.Config)
		return nil
	}
}

// surveyOnce connects once through raw's hosts with Connect, unless that
// was done already in this process, and returns the host it reached ("" if
// none, or if it did not survey).
func (m *hostMemory) surveyOnce(ctx context.Context, raw *pgx.ConnConfig) string {
	m.survey.Lock()
	defer m.survey.Unlock()
	m.mu.Lock()
	done := m.surveyed[listKey(&raw.Config)]
	m.mu.Unlock()
	if done {
		return ""
	}
	conn, err := Connect(ctx, raw)
	if err != nil {
		return ""
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return m.hostAt(conn.PgConn().Conn().RemoteAddr())
}

func (m *hostMemory) markSurveyed(cfg *pgconn.Config) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.surveyed[listKey(cfg)] = true
}

// listKey names a URL's host list.
func listKey(cfg *pgconn.Config) string { return strings.Join(Hosts(cfg), ",") }

// learn makes cfg's connection attempts record the names their hosts
// resolve to and the host that refuses one (refusalCodes), and tell
// stopped, if given.
func learn(cfg *pgconn.Config, stopped func(host string)) {
	lookup := cfg.LookupFunc
	if lookup == nil {
		lookup = net.DefaultResolver.LookupHost
	}
	cfg.LookupFunc = func(ctx context.Context, host string) ([]string, error) {
		addrs, err := lookup(ctx, host)
		hosts.mu.Lock()
		for _, a := range addrs {
			if ip, _, splitErr := net.SplitHostPort(a); splitErr == nil {
				a = ip
			}
			hosts.names[a] = host
		}
		hosts.mu.Unlock()
		return addrs, err
	}
	onError := cfg.OnPgError
	cfg.OnPgError = func(c *pgconn.PgConn, pe *pgconn.PgError) bool {
		// No backend key yet: the server refuses the session itself.
		if c.PID() == 0 && refusalCodes[pe.Code] {
			if host := hosts.refusedBy(c.Conn().RemoteAddr()); host != "" && stopped != nil {
				stopped(host)
			}
		}
		return onError == nil || onError(c, pe)
	}
}

// refusedBy records that the host at addr refused a session, and returns
// it as the URL names it ("" for a socket, which is not moved).
func (m *hostMemory) refusedBy(addr net.Addr) string {
	host := m.hostAt(addr)
	if host != "" {
		m.mu.Lock()
		m.refused[host] = time.Now()
		m.mu.Unlock()
	}
	return host
}

// hostAt is the host, as the URL names it, of a server at addr; "" for a
// socket.
func (m *hostMemory) hostAt(addr net.Addr) string {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok {
		return ""
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	name := tcp.IP.String()
	if n, ok := m.names[name]; ok {
		name = n
	}
	return net.JoinHostPort(name, strconv.Itoa(tcp.Port))
}

// arrange orders cfg's hosts so that those that refused a session within
// refusalMemory come last, each group in the URL's order.
func arrange(cfg *pgconn.Config) {
	entries := chainOf(cfg)
	hosts.mu.Lock()
	late := func(e *pgconn.FallbackConfig) bool {
		at, ok := hosts.refused[hostPort(e)]
		return ok && time.Since(at) < refusalMemory
	}
	var first, last []*pgconn.FallbackConfig
	for _, e := range entries {
		if late(e) {
			last = append(last, e)
		} else {
			first = append(first, e)
		}
	}
	hosts.mu.Unlock()
	setChain(cfg, append(first, last...))
}

// after leaves in cfg the hosts that come after host, and says whether
// there are any.
func after(cfg *pgconn.Config, host string) bool {
	entries := chainOf(cfg)
	i := slices.IndexFunc(entries, func(e *pgconn.FallbackConfig) bool { return hostPort(e) == host })
	if i < 0 {
		return false
	}
	for i < len(entries) && hostPort(entries[i]) == host {
		i++ // sslmode=prefer tries a host twice, with TLS and without
	}
	if i == len(entries) {
		return false
	}
	setChain(cfg, entries[i:])
	return true
}

// only leaves host alone in cfg, if cfg names it.
func only(cfg *pgconn.Config, host string) {
	var kept []*pgconn.FallbackConfig
	for _, e := range chainOf(cfg) {
		if hostPort(e) == host {
			kept = append(kept, e)
		}
	}
	if len(kept) > 0 {
		setChain(cfg, kept)
	}
}

// chainOf is cfg's hosts in the order pgx tries them, its own first.
func chainOf(cfg *pgconn.Config) []*pgconn.FallbackConfig {
	return append([]*pgconn.FallbackConfig{{Host: cfg.Host, Port: cfg.Port, TLSConfig: cfg.TLSConfig}}, cfg.Fallbacks...)
}

func setChain(cfg *pgconn.Config, entries []*pgconn.FallbackConfig) {
	cfg.Host, cfg.Port, cfg.TLSConfig = entries[0].Host, entries[0].Port, entries[0].TLSConfig
	cfg.Fallbacks = entries[1:]
}

func hostPort(e *pgconn.FallbackConfig) string {
	return net.JoinHostPort(e.Host, strconv.Itoa(int(e.Port)))
}

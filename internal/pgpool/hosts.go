package pgpool

import (
	"fmt"
	"net"
	"reflect"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Hosts lists the host:port of each server cfg names, in the order pgx
// tries them; sslmode=prefer's second try of a host is not another host.
func Hosts(cfg *pgconn.Config) []string {
	hosts := []string{net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))}
	for _, fb := range cfg.Fallbacks {
		h := net.JoinHostPort(fb.Host, strconv.Itoa(int(fb.Port)))
		if hosts[len(hosts)-1] != h {
			hosts = append(hosts, h)
		}
	}
	return hosts
}

// CheckHosts refuses a URL naming several hosts without
// target_session_attrs=read-write (or primary). wlproj writes on every
// connection; without it pgx keeps the first host that answers, and after
// a failover that may be a standby, where every claim and ack fails, or an
// old primary cut off from the others.
func CheckHosts(cfg *pgconn.Config) error {
	hosts := Hosts(cfg)
	if len(hosts) < 2 || writable(cfg.ValidateConnect) {
		return nil
	}
	return fmt.Errorf("names %d hosts (%s) but not target_session_attrs=read-write: "+
		"wlproj would stay on whichever host answers first, a read-only standby included; "+
		"add target_session_attrs=read-write (or primary)", len(hosts), strings.Join(hosts, ", "))
}

// writable says whether v is the check pgx installs for
// target_session_attrs=read-write or primary.
func writable(v pgconn.ValidateConnectFunc) bool {
	if v == nil {
		return false
	}
	p := reflect.ValueOf(v).Pointer()
	return p == reflect.ValueOf(pgconn.ValidateConnectTargetSessionAttrsReadWrite).Pointer() ||
		p == reflect.ValueOf(pgconn.ValidateConnectTargetSessionAttrsPrimary).Pointer()
}

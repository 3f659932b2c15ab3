package migrations

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
)

// Postgres runs a statement to its end whether or not the client that sent
// it is still there: after a kill -9 of wlproj migrate, or of its host, an
// index build would go on for as long as it waits, holding SHARE UPDATE
// EXCLUSIVE on its table (which stops VACUUM of it) with nobody to record
// it. Migrate's sessions ask the server to notice a client that is gone.
const (
	// clientCheckInterval: how often a running statement checks that its
	// client is still connected (client_connection_check_interval, Postgres
	// 14 and later). A poll of the socket each second costs nothing next to
	// an index build.
	clientCheckInterval = time.Second
	// The server's TCP keepalives find a client whose host vanished without
	// closing the connection (no FIN ever arrives) in about idle + interval
	// × count = 25 s; the connection check above then ends its statement,
	// and the end of its session frees goose's lock for a rerun, which tries
	// for it every 5 s for 5 minutes. The operating system's default idle
	// time is two hours.
	keepalivesIdle     = 10 * time.Second
	keepalivesInterval = 5 * time.Second
	keepalivesCount    = 3

	// clientCheckSince is the first server_version_num with
	// client_connection_check_interval.
	clientCheckSince = 140000
	clientCheckParam = "client_connection_check_interval"
)

// sessionParams names migrate's sessions and sets their keepalives, unless
// the operator's URL already sets them: the URL wins.
func sessionParams(cfg *pgx.ConnConfig) {
	seconds := func(d time.Duration) string { return strconv.Itoa(int(d.Seconds())) }
	for name, value := range map[string]string{
		"application_name":        ApplicationName,
		"tcp_keepalives_idle":     seconds(keepalivesIdle),
		"tcp_keepalives_interval": seconds(keepalivesInterval),
		"tcp_keepalives_count":    strconv.Itoa(keepalivesCount),
	} {
		if _, ok := cfg.RuntimeParams[name]; !ok {
			cfg.RuntimeParams[name] = value
		}
	}
}

// checkClient turns on the connection check on a new session when the
// server has it (an unknown parameter in the startup packet would refuse
// the connection on an older server) and the URL does not set it.
func checkClient(ctx context.Context, conn *pgx.Conn) error {
	if _, ok := conn.Config().RuntimeParams[clientCheckParam]; ok {
		return nil
	}
	if serverVersionNum(conn.PgConn().ParameterStatus("server_version")) < clientCheckSince {
		return nil
	}
	_, err := conn.Exec(ctx, "SELECT set_config($1, $2, false)", clientCheckParam, pgInterval(clientCheckInterval))
	return err
}

// serverVersionNum reads the server_version a server reports at start-up
// ("15.4", "16beta2", "17.0 (Debian 17.0-1)") as server_version_num does:
// 150004 for 15.4. Unreadable is 0.
func serverVersionNum(v string) int {
	var parts [2]int
	for i, field := range strings.SplitN(v, ".", 2) {
		end := 0
		for end < len(field) && field[end] >= '0' && field[end] <= '9' {
			end++
		}
		parts[i], _ = strconv.Atoi(field[:end])
	}
	return parts[0]*10000 + parts[1]
}

// logClientCheck says when a killed migrate's statements would outlive it:
// the server is older than 14, or the URL turned the check off. The rerun
// still ends such an orphaned index build (endBuilders).
func logClientCheck(ctx context.Context, db *sql.DB, log zerolog.Logger) {
	var setting sql.NullString
	if err := db.QueryRowContext(ctx, "SELECT current_setting($1, true)", clientCheckParam).Scan(&setting); err != nil {
		return
	}
	switch {
	case !setting.Valid:
		log.Warn().Msg("the server is older than Postgres 14 (no client_connection_check_interval): if this migrate is killed, an index build it started runs on until it ends; the next wlproj migrate terminates it")
	case setting.String == "0":
		log.Warn().Msg("client_connection_check_interval is 0 in the database URL: if this migrate is killed, an index build it started runs on until it ends; the next wlproj migrate terminates it")
	}
}

package harness

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"runtime"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// SessionConfig says where a drill or bench run works.
type SessionConfig struct {
	// AdminURL is a superuser's URL on the Postgres to use (DATABASE_URL).
	AdminURL string
	// ElasticURL is the engine (ELASTIC_URL).
	ElasticURL string
	// Name tells the run's database (wlproj_NAME_…) and index apart.
	Name string
	// Bin is a built wlproj. Defaults to building the checkout.
	Bin string
	// PoolSize is the admin pool's MaxConns. Defaults to pgxpool's.
	PoolSize int32
	// Roles names an owner and a runtime role of the run's own, dropped
	// after the database by Close; creating them is the caller's.
	Roles bool
	// Log receives progress lines. Defaults to none.
	Log func(format string, args ...any)
}

// Session is what a drill or bench run sets up before its first step: the
// checkout, a temporary directory, the binary, the servers' versions, and a
// migrated database and an index of its own. Close removes all of it.
type Session struct {
	Root     string
	Dir      string
	Bin      string
	Versions Versions
	// Engine is what the engine at ElasticURL said it is.
	Engine EngineInfo
	DB     DB
	Index  string
	// Owner and Runtime are the role names, if SessionConfig.Roles.
	Owner, Runtime string

	cfg      SessionConfig
	cleanups []func()
	keepDir  bool
}

// Versions of what a run ran on.
type Versions struct {
	Engine   string `json:"engine"`
	Postgres string `json:"postgres"`
	Go       string `json:"go"`
}

// Open sets a session up; on an error it removes what it had created.
func Open(ctx context.Context, cfg SessionConfig) (*Session, error) {
	if cfg.Log == nil {
		cfg.Log = func(string, ...any) {}
	}
	s := &Session{cfg: cfg}
	if err := s.open(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *Session) open(ctx context.Context) error {
	var err error
	if s.Root, err = RepoRoot(); err != nil {
		return err
	}
	if s.Dir, err = os.MkdirTemp("", "wlproj-"+s.cfg.Name+"-"); err != nil {
		return err
	}
	if s.Bin = s.cfg.Bin; s.Bin == "" {
		s.cfg.Log("building wlproj")
		if s.Bin, err = Build(ctx, s.Dir); err != nil {
			return err
		}
	}
	if s.Versions, s.Engine, err = serverVersions(ctx, s.cfg.AdminURL, s.cfg.ElasticURL); err != nil {
		return err
	}
	id := UniqueName("")
	s.DB.Name, s.Index = "wlproj_"+s.cfg.Name+"_"+id, "wlproj-"+s.cfg.Name+"-"+id
	if s.cfg.Roles {
		s.Owner, s.Runtime = "wlproj_owner_"+s.cfg.Name+"_"+id, "wlproj_runtime_"+s.cfg.Name+"_"+id
	}
	if s.DB.URL, err = CreateDatabase(ctx, s.cfg.AdminURL, s.DB.Name); err != nil {
		return err
	}
	poolCfg, err := pgxpool.ParseConfig(s.DB.URL)
	if err != nil {
		return err
	}
	poolCfg.MaxConns = cmp.Or(s.cfg.PoolSize, poolCfg.MaxConns)
	if s.DB.Pool, err = pgxpool.NewWithConfig(ctx, poolCfg); err != nil {
		return err
	}
	return CreateIndex(ctx, s.cfg.ElasticURL, s.Index)
}

func serverVersions(ctx context.Context, adminURL, elasticURL string) (Versions, EngineInfo, error) {
	v := Versions{Go: runtime.Version()}
	e, err := IdentifyEngine(ctx, elasticURL)
	if err != nil {
		return v, e, fmt.Errorf("engine at ELASTIC_URL: %w", err)
	}
	v.Engine = e.Distribution + " " + e.Version
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return v, e, fmt.Errorf("connect to DATABASE_URL: %w", err)
	}
	defer conn.Close(ctx)
	return v, e, conn.QueryRow(ctx, `SHOW server_version`).Scan(&v.Postgres)
}

// OnClose registers f to run first thing in Close, the latest registered
// first, so that what was started last stops first.
func (s *Session) OnClose(f func()) { s.cleanups = append(s.cleanups, f) }

// KeepDir leaves the temporary directory behind (logs of a failed run).
func (s *Session) KeepDir() { s.keepDir = true }

// Close runs the OnClose functions, then deletes the index, drops the
// database and the roles, and removes the directory; each on a deadline of
// its own, so that a Ctrl-C or a failed step still leaves nothing behind.
func (s *Session) Close() {
	for i := len(s.cleanups) - 1; i >= 0; i-- {
		s.cleanups[i]()
	}
	ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
	defer cancel()
	if s.DB.Pool != nil {
		s.DB.Pool.Close()
	}
	if s.Index != "" {
		if err := DeleteIndex(ctx, s.cfg.ElasticURL, s.Index); err != nil {
			s.cfg.Log("cleanup: delete index %s: %v", s.Index, err)
		}
	}
	if s.DB.Name != "" {
		// Right after a Postgres restart the first connections may be refused.
		err := Poll(ctx, dbTimeout, "drop database "+s.DB.Name, func(ctx context.Context) (bool, error) {
			err := DropDatabase(ctx, s.cfg.AdminURL, s.DB.Name)
			return err == nil, err
		})
		if err == nil {
			err = DropRoles(ctx, s.cfg.AdminURL, s.Runtime, s.Owner)
		}
		if err != nil {
			s.cfg.Log("cleanup: %v; drop database %s and roles %s, %s by hand", err, s.DB.Name, s.Owner, s.Runtime)
		}
	}
	if s.Dir != "" && !s.keepDir {
		_ = os.RemoveAll(s.Dir)
	}
}

package replica

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/projection"
)

var jsonUnmarshal = json.Unmarshal

// engine reads a search projection's engine: its nodes, TLS and one way to
// authenticate, whose secret comes from an environment variable or a file.
func (f fileReader) engine(name string, n *yaml.Node, s *SearchSpec) error {
	m, err := f.mapping(n, name, "engine", engineKeys)
	if err != nil {
		return err
	}
	for _, inline := range []string{"password", "api_key"} {
		if k, ok := m[inline]; ok {
			return f.fail(k, name, "engine."+inline, "a secret is never written in the file: use %s_env (an environment variable's name) or %s_file (a file's path)", inline, inline)
		}
	}
	urls, ok := m["urls"]
	if !ok || urls.Kind != yaml.SequenceNode || len(urls.Content) == 0 {
		return f.fail(n, name, "engine.urls", "is required: a list of the engine's node URLs")
	}
	for i, u := range urls.Content {
		if err := urlOf(u.Value); err != nil {
			return f.fail(u, name, fmt.Sprintf("engine.urls[%d]", i), "%s", err)
		}
		s.URLs = append(s.URLs, u.Value)
	}
	s.Username, s.CAFile = scalar(m["username"]), scalar(m["ca_file"])
	if s.CAFile != "" {
		if _, err := os.Stat(s.CAFile); err != nil {
			return f.fail(m["ca_file"], name, "engine.ca_file", "%s cannot be read: %s", s.CAFile, unwrapPath(err))
		}
	}
	if s.PasswordFrom, s.Engine.Password, err = f.secret(name, "password", m); err != nil {
		return err
	}
	if s.APIKeyFrom, s.Engine.APIKey, err = f.secret(name, "api_key", m); err != nil {
		return err
	}
	s.Engine.URL, s.Engine.Username, s.Engine.CAFile = strings.Join(s.URLs, ","), s.Username, s.CAFile
	if s.Timeout, err = f.timeout(name, m["timeout"]); err != nil {
		return err
	}
	s.Engine.Timeout = cmp.Or(s.Timeout, projection.TimeoutDefault)
	if err := s.Engine.ValidateAuth(); err != nil && !f.namesOnly {
		return f.fail(n, name, "engine", "%s", strings.NewReplacer("APIKey", "api_key", "Username", "username", "Password", "password").Replace(err.Error()))
	}
	return nil
}

// timeout reads engine.timeout, a Go duration within the engine client's
// range; zero when absent.
func (f fileReader) timeout(name string, n *yaml.Node) (time.Duration, error) {
	if n == nil {
		return 0, nil
	}
	d, err := time.ParseDuration(n.Value)
	if err != nil {
		return 0, f.fail(n, name, "engine.timeout", "%q is not a duration such as 30s", n.Value)
	}
	if err := bounds.Check("engine.timeout", d, projection.TimeoutRange); err != nil {
		return 0, f.fail(n, name, "engine.timeout", "%s", err)
	}
	return d, nil
}

// secret resolves what's _env or what's _file (at most one of them): where
// it comes from, as listed, and its value, which no error shows.
func (f fileReader) secret(name, what string, m map[string]*yaml.Node) (from, value string, err error) {
	env, file := m[what+"_env"], m[what+"_file"]
	switch {
	case env != nil && file != nil:
		return "", "", f.fail(file, name, "engine."+what+"_file", "give %s_env or %s_file, not both", what, what)
	case env != nil:
		from = "env " + env.Value
	case file != nil:
		from = "file " + file.Value
	default:
		return "", "", nil
	}
	if f.namesOnly {
		return from, "", nil
	}
	if env != nil {
		if value = f.getenv(env.Value); value == "" {
			return "", "", f.fail(env, name, "engine."+what+"_env", "the environment variable %s is not set or empty", env.Value)
		}
		return from, value, nil
	}
	body, err := os.ReadFile(file.Value)
	if err != nil {
		return "", "", f.fail(file, name, "engine."+what+"_file", "%s cannot be read: %s", file.Value, unwrapPath(err))
	}
	if value = strings.TrimSpace(string(body)); value == "" {
		return "", "", f.fail(file, name, "engine."+what+"_file", "%s is empty", file.Value)
	}
	return from, value, nil
}

// checkSet refuses what no one projection shows: two search projections
// writing one alias on the same engine, and a second chronicle (there is
// one chronicle table).
func (f fileReader) checkSet(specs Specs) error {
	aliases := map[string]string{}
	chronicle := ""
	for _, s := range specs {
		if s.Kind == KindChronicle {
			if chronicle != "" {
				return f.fail(nil, s.Name, "kind", "a second chronicle: %q is one already, and there is one chronicle table", chronicle)
			}
			chronicle = s.Name
			continue
		}
		for _, u := range s.Search.URLs {
			key := strings.TrimSuffix(u, "/") + " " + s.Search.Index
			if other, ok := aliases[key]; ok {
				return f.fail(nil, s.Name, "index", "%q on %s is projection %q's alias too: two projections on one alias overwrite each other's documents", s.Search.Index, u, other)
			}
			aliases[key] = s.Name
		}
	}
	return nil
}

// Chronicle returns the configured chronicle's name, if any.
func (s Specs) Chronicle() (string, bool) {
	i := slices.IndexFunc(s, func(p Spec) bool { return p.Kind == KindChronicle })
	if i < 0 {
		return "", false
	}
	return s[i].Name, true
}

// SearchNames lists the search projections' names, sorted.
func (s Specs) SearchNames() []string {
	var names []string
	for _, p := range s {
		if p.Kind == KindSearch {
			names = append(names, p.Name)
		}
	}
	slices.Sort(names)
	return names
}

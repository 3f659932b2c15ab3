package replica

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
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

// setCheck refuses what no one projection shows: two search projections
// writing one alias on the same engine, and a second chronicle (there is
// one chronicle table). Each projection is added as it is read, so that a
// refusal names the line of the second.
type setCheck struct {
	aliases   map[string]string // engineNode(url) + " " + alias: the projection
	chronicle string
}

func (f fileReader) checkAdded(c *setCheck, s Spec, n *yaml.Node) error {
	if s.Kind == KindChronicle {
		if c.chronicle != "" {
			return f.fail(valueOf(n, "kind"), s.Name, "kind", "a second chronicle: %q is one already, and there is one chronicle table", c.chronicle)
		}
		c.chronicle = s.Name
		return nil
	}
	if c.aliases == nil {
		c.aliases = map[string]string{}
	}
	for _, u := range s.Search.URLs {
		key := engineNode(u) + " " + s.Search.Index
		if other, ok := c.aliases[key]; ok && other != s.Name {
			return f.fail(valueOf(n, "index"), s.Name, "index", "%q on %s is projection %q's alias too: two projections on one alias overwrite each other's documents", s.Search.Index, u, other)
		}
		c.aliases[key] = s.Name
	}
	return nil
}

// engineNode is the node a URL reaches, as the client connects to it: its
// host in lower case (an IP address in its one form, localhost and every
// loopback address as one), its port with the scheme's default made
// explicit, and its path without a trailing slash (a gateway may route
// paths to different engines). http and https on one port cannot both be
// served, so the scheme is not part of it. A host name is not resolved:
// its address may change, and two names of one engine are then two engines
// to this check.
func engineNode(raw string) string {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return raw // urlOf refused it already
	}
	host, port := strings.ToLower(u.Hostname()), u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[strings.ToLower(u.Scheme)]
	}
	if ip := net.ParseIP(host); ip != nil {
		host = ip.String()
	}
	if host == "localhost" || net.ParseIP(host).IsLoopback() {
		host = "loopback"
	}
	return net.JoinHostPort(host, port) + strings.TrimRight(u.EscapedPath(), "/")
}

// valueOf is the node of key's value in the mapping n, or n itself when
// there is none (a flow mapping's line is its own).
func valueOf(n *yaml.Node, key string) *yaml.Node {
	for i := 0; n.Kind == yaml.MappingNode && i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return n
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

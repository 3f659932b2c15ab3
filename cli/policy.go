package cli

import (
	"fmt"
	"strings"

	"github.com/wlproj/wlproj/policy"
)

type policyCmd struct {
	Check policyCheckCmd `cmd:"" help:"Check a policy file as run does when it starts, without starting anything: the file, and the projections it names against the projections file's (or the built-in ones); exit 2 naming the file, line and key at fault. With --user (and --group), print what that person may do."`
}

type policyCheckCmd struct {
	projectionsFlags
	PolicyFile string   `name:"policy-file" help:"The policy file to check." env:"OUTBOX_POLICY_FILE" placeholder:"PATH"`
	User       string   `help:"Print the grants of this user (the name they sign in with)."`
	Group      []string `help:"Groups of --user, as their OpenID Connect sign-in names them; repeatable."`
}

func (c *policyCheckCmd) Run(g *globals) error {
	if c.PolicyFile == "" {
		return badFile(fmt.Errorf("--policy-file (OUTBOX_POLICY_FILE) is required: the file to check"))
	}
	p, err := policy.Load(c.PolicyFile)
	if err != nil {
		return badFile(err)
	}
	names, err := c.names()
	if err != nil {
		return badFile(err)
	}
	if err := p.CheckProjections(names); err != nil {
		return badFile(err)
	}
	fmt.Fprintf(g.stdout, "%s: valid for projections %s\n", c.PolicyFile, strings.Join(names, ", "))
	if c.User == "" {
		return nil
	}
	a := (&policy.Actor{User: c.User, Groups: c.Group}).WithGrants(p.For(c.User, c.Group))
	if a.Grants.None() {
		fmt.Fprintf(g.stdout, "%s: no role; the console refuses every page (403, audited)\n", c.User)
		return nil
	}
	fmt.Fprintf(g.stdout, "%s: roles %s\n", c.User, strings.Join(a.Roles, ", "))
	for _, act := range policy.Actions {
		if !a.Grants.CanAnywhere(act) {
			continue
		}
		fmt.Fprintf(g.stdout, "  %-8s %s\n", act, describeAllowed(a.Grants.Allowed(act)))
	}
	return nil
}

// describeAllowed says where an action is allowed, as pairs of projection
// and scope patterns.
func describeAllowed(a *policy.Allowed) string {
	if a == nil {
		return "every projection, every scope"
	}
	var pairs []string
	for i := range a.Projections {
		pairs = append(pairs, fmt.Sprintf("%s/%s", unlike(a.Projections[i]), unlike(a.Scopes[i])))
	}
	return strings.Join(pairs, ", ")
}

// unlike is a LIKE pattern of policy.Like as its file wrote it.
func unlike(s string) string {
	return strings.NewReplacer(`\\`, `\`, `\%`, `%`, `\_`, `_`, `%`, `*`).Replace(s)
}

package policy

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const example = `
roles:
  admin:
    actions: [view, replay, discard, archive, restore, pause, unmask]
    projections: ["*"]
    scopes: ["*"]
  library-3:
    actions: [replay, discard]
    projections: [books]
    scopes: [library-3, "library-3/*"]
  reader:
    actions: [view]
    projections: [books, timeline]
    scopes: ["*"]
users:
  ada@example.com: [admin]
groups:
  lib3-ops: [library-3]
  readers: [reader]
`

func TestParseGrantsByUserAndGroup(t *testing.T) {
	p, err := Parse("policy.yaml", []byte(example))
	require.NoError(t, err)

	ada := p.For("ada@example.com", nil)
	assert.Nil(t, ada.Allowed(Replay), "admin's grants are unrestricted")
	assert.True(t, ada.Whole(Pause, "books"))

	lib3 := p.For("bo", []string{"lib3-ops"})
	assert.True(t, lib3.Can(Replay, "books", "library-3"))
	assert.True(t, lib3.Can(View, "books", "library-3/east"), "every action implies view")
	assert.False(t, lib3.Can(Replay, "books", "library-30"), "a pattern is not a prefix")
	assert.False(t, lib3.Can(Replay, "books", "library-4"))
	assert.False(t, lib3.Can(Replay, "timeline", "library-3"))
	assert.False(t, lib3.Can(Archive, "books", "library-3"))
	assert.False(t, lib3.Can(View, "books", ""), "an event without a scope key is not library-3's")
	assert.False(t, lib3.Whole(View, "books"), "a scoped role does not see the projection's aggregates")
	assert.Equal(t, &Allowed{Projections: []string{"books", "books"}, Scopes: []string{"library-3", "library-3/%"}}, lib3.Allowed(Replay))
	assert.Equal(t, []string{"books"}, lib3.Visible(View, []string{"books", "timeline"}))

	nobody := p.For("eve", []string{"strangers"})
	assert.True(t, nobody.None())
	assert.Equal(t, &Allowed{Projections: []string{}, Scopes: []string{}}, nobody.Allowed(View), "no grant: no row, not every row")

	both := p.For("cy", []string{"lib3-ops", "readers"})
	assert.True(t, both.Can(View, "timeline", "library-9"))
	assert.False(t, both.Can(Replay, "timeline", "library-3"), "one role's action does not reach another role's projections")
	assert.Equal(t, []string{"library-3", "reader"}, (&Actor{}).WithGrants(both).Roles)
}

func TestParseRefusesNamingFileLineAndKey(t *testing.T) {
	cases := map[string]struct{ text, want string }{
		"unknown action": {"roles:\n  r:\n    actions: [view, repaly]\n    projections: [\"*\"]\n    scopes: [\"*\"]\nusers:\n  a: [r]\n",
			`p.yaml:3: roles.r.actions: unknown action "repaly"`},
		"missing scopes": {"roles:\n  r:\n    actions: [view]\n    projections: [\"*\"]\nusers:\n  a: [r]\n",
			`p.yaml:3: roles.r.scopes: is required`},
		"undefined role": {"roles:\n  r:\n    actions: [view]\n    projections: [\"*\"]\n    scopes: [\"*\"]\ngroups:\n  g: [r, admin]\n",
			`p.yaml:7: groups.g: names role "admin", which roles does not define`},
		"unknown key": {"roles:\n  r:\n    actions: [view]\n    projections: [\"*\"]\n    scope: [\"*\"]\nusers:\n  a: [r]\n",
			`p.yaml:5: roles.r.scope: unknown key`},
		"duplicate user": {"roles:\n  r:\n    actions: [view]\n    projections: [\"*\"]\n    scopes: [\"*\"]\nusers:\n  a: [r]\n  a: [r]\n",
			`p.yaml:8: users.a: given twice`},
		"empty list": {"roles:\n  r:\n    actions: []\n    projections: [\"*\"]\n    scopes: [\"*\"]\nusers:\n  a: [r]\n",
			`p.yaml:3: roles.r.actions: is empty`},
		"nobody granted": {"roles:\n  r:\n    actions: [view]\n    projections: [\"*\"]\n    scopes: [\"*\"]\n",
			`users: no user or group is granted a role`},
		"top key": {"role:\n  r: {}\n", `p.yaml:1: role: unknown key`},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Parse("p.yaml", []byte(c.text))
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

func TestCheckProjectionsRefusesAnUnknownName(t *testing.T) {
	p, err := Parse("policy.yaml", []byte(example))
	require.NoError(t, err)
	require.NoError(t, p.CheckProjections([]string{"books", "timeline"}))
	err = p.CheckProjections([]string{"books"})
	require.Error(t, err)
	assert.Equal(t, `policy.yaml:13: roles.reader.projections: names projection "timeline", which this replica does not run (it runs: books)`, err.Error())
}

func TestMatch(t *testing.T) {
	for _, c := range []struct {
		pattern, s string
		want       bool
	}{
		{"*", "", true}, {"*", "x", true}, {"a", "a", true}, {"a", "ab", false},
		{"a*", "a", true}, {"a*", "abc", true}, {"*c", "abc", true}, {"*c", "cb", false},
		{"a*a", "a", false}, {"a*a", "aa", true}, {"a*b*c", "axbyc", true}, {"a*b*c", "acb", false},
		{"lib-%", "lib-1", false}, {"lib-_", "lib-1", false},
	} {
		assert.Equal(t, c.want, Match(c.pattern, c.s), "%q ~ %q", c.pattern, c.s)
	}
	assert.Equal(t, `lib\_1\%%`, Like("lib_1%*"))
}

package cli

import (
	"testing"

	"github.com/alecthomas/kong"
	"github.com/stretchr/testify/require"
)

// Every flag with a `field` tag is renamed as kong names it: its variable
// where it has one, else its --flag (kebab is kong's naming, checked here).
func TestFlagNamesAreKongs(t *testing.T) {
	t.Parallel()
	var c commandLine
	parser, err := kong.New(&c, kong.Vars(flagVars()))
	require.NoError(t, err)
	checked := 0
	var walk func(n *kong.Node)
	walk = func(n *kong.Node) {
		if n.Type == kong.CommandNode {
			names := flagNames(n.Target.Addr().Interface())
			for _, f := range n.Flags {
				field := f.Tag.Get("field")
				if field == "" {
					continue
				}
				want := "--" + f.Name
				if len(f.Envs) > 0 {
					want = f.Envs[0]
				}
				require.Equal(t, want, names[field], "%s: field %s", n.Path(), field)
				checked++
			}
		}
		for _, child := range n.Children {
			walk(child)
		}
	}
	walk(parser.Model.Node)
	require.Greater(t, checked, 50)
}

func TestKebab(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"By": "by", "BulkSize": "bulk-size", "EmitBacklog": "emit-backlog", "HTTPPort": "http-port"} {
		require.Equal(t, want, kebab(in), in)
	}
}

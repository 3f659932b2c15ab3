package cli

import (
	"fmt"

	"github.com/alecthomas/kong"

	"github.com/wlproj/wlproj/internal/buildinfo"
)

// versionFlag is --version: the one line, then exit 0, before any command
// or required flag is looked at.
type versionFlag bool

func (versionFlag) BeforeReset(app *kong.Kong) error {
	fmt.Fprintln(app.Stdout, buildinfo.Get())
	app.Exit(0)
	return nil
}

type versionCmd struct {
	JSON bool `name:"json" help:"Print one JSON object."`
}

func (c *versionCmd) Run(g *globals) error {
	if c.JSON {
		writeJSON(g.stdout, buildinfo.Get())
		return nil
	}
	fmt.Fprintln(g.stdout, buildinfo.Get())
	return nil
}

// Command wlproj drains a Postgres outbox into projections (an Elasticsearch
// index first). The command line is package cli; the replica it runs is
// assembled by package replica.
package main

import (
	"os"

	"github.com/wlproj/wlproj/cli"
)

func main() {
	os.Exit(cli.Run(os.Args[1:], os.Stdout, os.Stderr))
}

// Package cli is wlproj's command line: the kong model of every command,
// the flags they share, their exit codes and output, and the one renamer
// that says a package's *bounds.FieldError in the operator's words. main
// calls Run; the replica itself is assembled by package replica.
//
// One file per command group (run, status, failed and replay, rebuild,
// pause and resume, doc, console, verify, migrate, version); the helpers
// they share are in files named for what they do: flags.go, vars.go,
// names.go, exit.go, connect.go, format.go, trace.go (the span of a
// state-changing command).
package cli

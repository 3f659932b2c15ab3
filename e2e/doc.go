// Package e2e drives the built wlproj binary as an operator would: real
// replicas against the real stack (kill -9, SIGTERM, SIGSTOP, partitions,
// TLS, pause, notify, the ledger across kills), the binary's command line,
// and the runbook, whose marked blocks are run as written and whose
// configuration table is held to the CLI's model. It has no code of its
// own beside this file: the tests are its content.
package e2e

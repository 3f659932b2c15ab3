// Package replica is wlproj's composition root: what one `wlproj run`
// process is. It owns the projection registry (every projection this
// binary knows, by name), builds the services the leader runs, and runs
// the pool, the elector, the health and metrics server and the operator
// console for as long as its context lives.
//
// Its Config carries no flag or variable names: the CLI fills it, and says
// a *bounds.FieldError from Validate or New in the operator's words. Tests
// and tools can start a replica in-process with Run.
package replica

// Package harness is the one test harness of wlproj: the tests, the drill
// and the bench find the checkout, build the binary, make a database and an
// index of their own, drive real replicas, wait for a condition or a
// leader, produce events and check that none was lost, all through it.
//
// Each piece of logic is written once, as a function that returns an
// error, for the drill and the bench. A test calls the thin wrapper that
// takes a testing.TB and fails the test instead:
//
//	error form                            test form
//	RepoRoot                              Root
//	Build                                 Binary
//	FreePort                              Port
//	CreateDatabase, CreateEmptyDatabase   NewDatabase, NewEmptyDatabase
//	DropRoles                             Roles
//	UserURL                               DB.Login
//	CreateIndex                           NewIndex (NewIndexName: no index)
//	Poll, PollOne                         Eventually, EventuallyOne
//	Start, Replica.WaitHealthy            StartReplica, Healthy
//	WaitLeader                            Leader
//	WaitDrained                           Drained
//	Verify                                Verified
//	IdentifyEngine                        Engine
//	StartSecuredNode                      SecuredEngine
//	SourceDiff                            SourceMatched
//	ForgetDeletes                         DeletesForgotten
//	RolesSQL.Apply                        ApplyRoles
//
// For tests alone: Column and Pairs read a query's rows, Outbox is a
// database with an outbox.Store on it, and SourceWriter is an application
// that keeps a source-of-truth table next to its outbox events.
//
// Session is the drill's and the bench's setup in one: the binary, a
// migrated database, an index, and their removal.
//
// Tests and drills observe state, never the wording of log lines: rows,
// /healthz (WaitLeader, WaitRole), /metrics (Metric, WatchPeak), and
// pg_stat_activity (WaitStandby).
//
// The database's health beside a run's own figures (horizon.go,
// dbhealth.go): who holds the vacuum horizon (OldestSnapshot of our
// sessions, OldestHorizon of anyone's), whether VACUUM can remove dead
// rows (DeleteRows, DeadRows.Vacuum), the dead rows and vacuums of the
// tables that churn (Tables), lock waits (WaitingForLocks), sampled every
// second by WatchHealth and summed up per step or window by Summarize.
package harness

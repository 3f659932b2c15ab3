package outbox

// For the plan tests of package outbox_test.
var (
	ClaimSQL       = claimSQL
	ClaimPlan      = claimPlan
	ByKeyPlan      = byKeyPlan
	ClaimStatement = claimStatement
	GaugesSQL      = gaugesSQL
	SnapshotSQL    = snapshotSQL

	ReadQueuedSQL       = readQueuedSQL
	ReadQueuedLedgerSQL = readQueuedLedgerSQL
	QueuedPlan          = queuedPlan

	AckDoneSQL       = ackDoneSQL
	AckQueuedSQL     = ackQueuedSQL
	AckFailedSQL     = ackFailedSQL
	ReleaseSQL       = releaseSQL
	ReclaimSQL       = reclaimSQL
	StatesSQL        = statesSQL
	RebuildWritesSQL = rebuildWritesSQL
	LeaderSQL        = leaderSQL

	AuditedSinceSQL = auditedSinceSQL
)

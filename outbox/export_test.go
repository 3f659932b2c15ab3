package outbox

// For the plan tests of package outbox_test.
var (
	ClaimSQL       = claimSQL
	ClaimPlan      = claimPlan
	ByKeyPlan      = byKeyPlan
	ClaimStatement = claimStatement
	GaugesSQL      = gaugesSQL

	ReadQueuedSQL       = readQueuedSQL
	ReadQueuedLedgerSQL = readQueuedLedgerSQL
	QueuedPlan          = queuedPlan
	PruneQueuedSQL      = pruneQueuedSQL

	AckDoneSQL       = ackDoneSQL
	AckQueuedSQL     = ackQueuedSQL
	AckFailedSQL     = ackFailedSQL
	ReleaseSQL       = releaseSQL
	ReclaimSQL       = reclaimSQL
	PruneDoneSQL     = pruneDoneSQL
	StatesSQL        = statesSQL
	RebuildWritesSQL = rebuildWritesSQL
	LeaderSQL        = leaderSQL

	AuditedSinceSQL = auditedSinceSQL
)

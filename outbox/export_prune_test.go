package outbox

// For the ledger pruner's plan test in package outbox_test.
var (
	PruneTombstonesSQL = pruneTombstonesSQL
	PruneLiveSQL       = pruneLiveSQL
)

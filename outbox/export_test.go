package outbox

// For the plan tests of package outbox_test.
var (
	ClaimSQL  = claimSQL
	ClaimPlan = claimPlan
	GaugesSQL = gaugesSQL

	AuditedSinceSQL = auditedSinceSQL
)

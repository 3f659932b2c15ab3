package outbox

import "fmt"

// CarryLedgerSQL is the ledger rotation's carry of partition slot, for its
// plan tests in package outbox_test.
func CarryLedgerSQL(slot int) string { return fmt.Sprintf(carryLedgerSQL, ledgerPartition(slot)) }

// CarryPlan is the carry's settings.
var CarryPlan = carryPlan

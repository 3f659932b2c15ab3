package outbox

import "fmt"

// CarryLedgerSQL is the ledger rotation's carry of partition slot, for its
// plan tests in package outbox_test.
func CarryLedgerSQL(slot int) string { return fmt.Sprintf(carryLedgerSQL, slot) }

// CarryBacklogSQL is the ledger rotation's carry of the backlog's entries
// out of partition slot.
func CarryBacklogSQL(slot int) string { return fmt.Sprintf(carryBacklogSQL, slot) }

// CarryPlan is the carry's settings.
var CarryPlan = carryPlan

// CarryEventsSQL, EventsHeldSQL and YoungEventsSQL are the outbox
// rotation's statements over partition slot, for the plan tests.
func CarryEventsSQL(slot int) string {
	return fmt.Sprintf(carryEventsSQL, eventsRotated.partitionOf(slot), eventsRotated.partitionOf((slot+2)%rotationSlots), slot)
}

func EventsHeldSQL(slot int) string {
	return fmt.Sprintf(eventsHeldSQL, eventsRotated.partitionOf(slot))
}

func YoungEventsSQL(slot int) string {
	return fmt.Sprintf(youngEventsSQL, eventsRotated.partitionOf(slot))
}

package projection

import "context"

// Rebuilding is where a bulk goes while a rebuild keeps two indexes of the
// handler's projection: first Target, then Old, or the handler's own index
// when Old is empty. The zero value is no rebuild: the handler's index alone.
type Rebuilding struct {
	// Target is the rebuild's new index.
	Target string
	// Old is the index the alias pointed at when the rebuild opened. It is
	// written by name instead of the alias, which names Old or Target all
	// along, so that neither misses a bulk in flight while the alias
	// moves. Empty when there was none, or when it was a concrete index
	// that the swap replaces by the alias.
	Old string
	// Swapped says the alias points at Target, so Target's answer is the
	// event's; Old is kept, and written, for a rollback, and its refusal of
	// a document (its older mapping) is not the event's failure.
	Swapped bool
}

// RebuildIndexes is a RebuildTarget that names both indexes of a rebuild,
// before and after its swap (package rebuild's DualWrite). The handler
// prefers it to RebuildIndex.
type RebuildIndexes interface {
	RebuildIndexes(ctx context.Context) (Rebuilding, error)
}

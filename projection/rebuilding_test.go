package projection

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/classify"
	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// rebuildingAt is a RebuildIndexes that names fixed indexes.
type rebuildingAt struct{ r Rebuilding }

func (x rebuildingAt) RebuildIndex(context.Context) (string, error)       { return x.r.Target, nil }
func (x rebuildingAt) RebuildIndexes(context.Context) (Rebuilding, error) { return x.r, nil }

// TestSearchWritesBothIndexesOfARebuild: before the swap a bulk goes to the
// rebuild's index and then to the old one by name, not through the alias,
// which names one of the two and moves; after the swap it goes on to the
// old index, kept for a rollback, whose refusal for good (its older
// mapping) does not fail the event while its transient failure does.
func TestSearchWritesBothIndexesOfARebuild(t *testing.T) {
	t.Parallel()
	b, target, old := setup(t), setup(t), setup(t)
	b.search.DualWriteTo(rebuildingAt{Rebuilding{Target: target.index, Old: old.index}})
	requireApplied(t, handle(t, b.search, upsert(1, "book", "1", v(2), book("Dune")))[1])
	target.requireDoc(t, "book:1", 2, "Dune")
	old.requireDoc(t, "book:1", 2, "Dune")
	require.Nil(t, b.doc(t, "book:1"), "the handler's own name is not written: the alias names one of the two")

	b.search.DualWriteTo(rebuildingAt{Rebuilding{Target: target.index, Old: old.index, Swapped: true}})
	requireApplied(t, handle(t, b.search, upsert(2, "book", "2", v(1), book("Emma")), del(3, "book", "1", v(3)))[2])
	target.requireDoc(t, "book:2", 1, "Emma")
	old.requireDoc(t, "book:2", 1, "Emma")
	require.Nil(t, old.doc(t, "book:1"), "the delete reached the old index")

	// The old index's older mapping refuses a field: the new one serves it.
	strict := harness.NewIndexName(t)
	require.NoError(t, harness.ES(context.Background(), b.base, http.MethodPut, "/"+strict,
		[]byte(`{"mappings": {"dynamic": "strict", "properties": {"kind": {"type": "keyword"}}}}`), nil))
	t.Cleanup(func() { _ = harness.DeleteIndex(context.Background(), b.base, strict) })
	b.search.DualWriteTo(rebuildingAt{Rebuilding{Target: target.index, Old: strict, Swapped: true}})
	requireApplied(t, handle(t, b.search, upsert(4, "book", "4", v(1), book("x")))[4])
	target.requireDoc(t, "book:4", 1, "x")

	// The old index cannot take writes for now: the event is retried.
	require.NoError(t, harness.ES(context.Background(), b.base, http.MethodPut, "/"+old.index+"/_settings",
		[]byte(`{"index.blocks.read_only_allow_delete": true}`), nil))
	t.Cleanup(func() {
		_ = harness.ES(context.Background(), b.base, http.MethodPut, "/"+old.index+"/_settings",
			[]byte(`{"index.blocks.read_only_allow_delete": null}`), nil)
	})
	b.search.DualWriteTo(rebuildingAt{Rebuilding{Target: target.index, Old: old.index, Swapped: true}})
	ce := requireFailed(t, handle(t, b.search, upsert(5, "book", "5", v(1), book("y")))[5], classify.Transient, classify.RateLimited)
	require.Contains(t, ce.Message, "rollback index "+old.index+": ")
}

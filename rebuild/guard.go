package rebuild

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/wlproj/wlproj/projection"
)

const (
	// refusedDocsMax bounds the refused documents a run remembers for the
	// check before its swap; past it the check reads the source table
	// again, as for a resumed run.
	refusedDocsMax = 100_000
	// lostShown bounds the ids a refused swap names; all are counted.
	lostShown = 20
	// mgetPage is the ids one _mget of the check reads.
	mgetPage = 1000
)

// guard refuses the swap (a *RefusedError; the rebuild stays open) while
// the new index lacks a document the old one has because the rebuild
// refused its row: the new mapping refused it, its payload was over the
// limit, its emitted event failed or was discarded. After the swap
// readers would miss it, and nothing would bring it back. AllowRefused
// swaps anyway; either way the report and the swap's audit row carry what
// the check found. A document the old index lacks too is no loss, and
// does not hold the swap.
func (r *runner) guard(ctx context.Context, row *Row) error {
	if row.RowsRefused == 0 || row.OldIndex == "" {
		return nil
	}
	docs := r.rep.refusedDocs
	if int64(len(docs)) < row.RowsRefused {
		// Rows refused before this run resumed, or more than it kept.
		r.cfg.Progress.Note(fmt.Sprintf("%d rows were refused; reading %s again for the documents %s lacks",
			row.RowsRefused, r.table, row.Target))
		var err error
		if docs, err = r.missingFromTarget(ctx, row); err != nil {
			return err
		}
	}
	lost, err := r.lost(ctx, row, docs)
	if err != nil {
		return err
	}
	r.rep.Lost, r.rep.LostIDs = int64(len(lost)), lost[:min(len(lost), refusedKept)]
	switch {
	case len(lost) == 0:
		return nil
	case r.cfg.AllowRefused:
		r.cfg.Progress.Note(fmt.Sprintf("swapping with --allow-refused: %s lacks %d documents that %s has (%s)",
			row.Target, len(lost), row.OldIndex, shown(lost)))
		return nil
	}
	return refusedf("not swapped: %s lacks %d documents that %s has, because the rebuild refused their rows (%s; see "+
		"refused_by_reason), and readers would lose them. Put the rows right through the application (their events reach "+
		"the new index too) and run the same command again, or --abort it, or swap anyway with --allow-refused",
		row.Target, len(lost), row.OldIndex, shown(lost))
}

func shown(ids []string) string {
	if len(ids) <= lostShown {
		return strings.Join(ids, ", ")
	}
	return strings.Join(ids[:lostShown], ", ") + fmt.Sprintf(" and %d more", len(ids)-lostShown)
}

// lost are the ids of docs the old index has and the new one lacks, read
// now, sorted.
func (r *runner) lost(ctx context.Context, row *Row, docs map[string]bool) ([]string, error) {
	ids := make([]string, 0, len(docs))
	for id := range docs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	var lost []string
	for page := range slices.Chunk(ids, mgetPage) {
		inNew, err := r.eng.mget(ctx, row.Target, page, false)
		if err != nil {
			return nil, err
		}
		inOld, err := r.eng.mget(ctx, row.OldIndex, page, false)
		if err != nil {
			return nil, err
		}
		for _, id := range page {
			if _, had := inOld[id]; had {
				if _, has := inNew[id]; !has {
					lost = append(lost, id)
				}
			}
		}
	}
	return lost, nil
}

// missingFromTarget reads the source table again, a page per statement,
// and returns the ids of its rows the new index lacks: the refused ones,
// and those the ledger holds a delete of, which the old index lacks too.
func (r *runner) missingFromTarget(ctx context.Context, row *Row) (map[string]bool, error) {
	missing := map[string]bool{}
	var after *key
	for {
		rows, err := readPage(ctx, r.cfg.Pool, r.table, after)
		if err != nil {
			return nil, err
		}
		ids := make([]string, len(rows))
		for i, s := range rows {
			ids[i] = projection.DocumentID(s.EntityType, s.EntityID)
		}
		for page := range slices.Chunk(ids, mgetPage) {
			has, err := r.eng.mget(ctx, row.Target, page, false)
			if err != nil {
				return nil, err
			}
			for _, id := range page {
				if _, ok := has[id]; !ok {
					missing[id] = true
				}
			}
		}
		if len(rows) < sourcePage {
			return missing, nil
		}
		after = &key{Type: rows[len(rows)-1].EntityType, ID: rows[len(rows)-1].EntityID}
	}
}

package verify

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"strconv"
	"sync"
)

// fingerprint sums a hash of every (_id, version) of one side: two sides
// with equal fingerprints hold the same documents at the same versions,
// whatever order they were read in (two independent 64-bit sums make a
// chance match negligible). It lets a clean index be proven with one read
// of each side, side by side, and no lookup at all.
type fingerprint struct {
	count      int64
	sum1, sum2 uint64
}

// fingerprinter hashes with seeds of its own run: both sides are hashed by
// the same process.
type fingerprinter struct{ seed1, seed2 maphash.Seed }

func newFingerprinter() fingerprinter {
	return fingerprinter{seed1: maphash.MakeSeed(), seed2: maphash.MakeSeed()}
}

func (f fingerprinter) add(fp *fingerprint, id string, version int64) {
	var v [8]byte
	binary.LittleEndian.PutUint64(v[:], uint64(version))
	var h1, h2 maphash.Hash
	h1.SetSeed(f.seed1)
	h2.SetSeed(f.seed2)
	for _, h := range []*maphash.Hash{&h1, &h2} {
		_, _ = h.WriteString(strconv.Itoa(len(id)))
		_, _ = h.WriteString(id)
		_, _ = h.Write(v[:])
	}
	fp.count++
	fp.sum1 += h1.Sum64()
	fp.sum2 += h2.Sum64()
}

// equalByFingerprint reads the whole index and the whole source table at
// the same time and reports whether they hold the same documents at the
// same versions, and how many the index holds. The table is read in
// key-ordered pages, each a statement of its own: a snapshot held for the
// whole read would stop vacuum in the whole database for as long, seconds
// for a million rows and longer under a rate cap. Every page of either
// side waits on the cap.
//
// The two sides are then read at different moments, document by
// document, as they were with one snapshot of the table beside a scroll
// of the index. Equal sums still prove the index clean: a document that
// differs for the whole read adds a pair one side lacks. A document that
// changed during the read may make the sums differ; the comparison
// document by document then settles it, as it does any live change.
func (v *run) equalByFingerprint(ctx context.Context) (bool, int64, error) {
	db := v.database()
	f := newFingerprinter()
	var index, source fingerprint
	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, 2)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		if errs[0] = v.engine.scroll(gctx, v.cfg.Page, func(page []hit) error {
			if err := v.wait(gctx, len(page)); err != nil {
				return err
			}
			for _, h := range page {
				f.add(&index, h.ID, h.Version)
			}
			return nil
		}); errs[0] != nil {
			cancel()
		}
	}()
	go func() {
		defer wg.Done()
		if errs[1] = v.fingerprintSource(gctx, db, f, &source); errs[1] != nil {
			cancel()
		}
	}()
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return false, 0, fmt.Errorf("fingerprints: %w", err)
	}
	return index == source, index.count, nil
}

// fingerprintSource reads the source table's keys and versions in
// key-ordered pages, a statement each.
func (v *run) fingerprintSource(ctx context.Context, db database, f fingerprinter, fp *fingerprint) error {
	var after *key
	for {
		rows, err := db.keys(ctx, after, v.cfg.Page)
		if err != nil {
			return err
		}
		if err := waitN(ctx, v.limitSource, len(rows)); err != nil {
			return err
		}
		for _, r := range rows {
			f.add(fp, documentID(r.key), r.version)
		}
		if len(rows) < v.cfg.Page {
			return nil
		}
		after = &rows[len(rows)-1].key
	}
}

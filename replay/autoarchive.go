package replay

import (
	"context"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/leader"
)

// AutoArchiveBy is the audit name of the leader's automatic archive.
const AutoArchiveBy = "auto-archive"

// autoArchiveInterval is how often the leader looks for rows to archive:
// the age threshold is hours or days, so a minute is prompt enough.
const autoArchiveInterval = time.Minute

// ArchiveAfterRange is what the auto-archive age accepts when it is on.
var ArchiveAfterRange = bounds.Range[time.Duration]{Min: time.Hour, Max: 10 * 365 * 24 * time.Hour}

// AutoArchiver is the leader's optional service that archives failed and
// discarded rows once their failure is older than After, in batches, each
// batch audited as by "auto-archive". Off unless configured: an operator
// who reviews failures by hand wants them in the hot table.
type AutoArchiver struct {
	leader.Periodic
	db    Beginner
	after time.Duration
	log   zerolog.Logger
}

// NewAutoArchiver validates after and builds the service.
func NewAutoArchiver(db Beginner, after time.Duration, log zerolog.Logger) (*AutoArchiver, error) {
	if err := bounds.Check("After", after, ArchiveAfterRange); err != nil {
		return nil, err
	}
	a := &AutoArchiver{db: db, after: after, log: log.With().Str("service", "auto_archive").Logger()}
	a.Periodic = leader.Periodic{ServiceName: "auto_archive", Interval: autoArchiveInterval, Log: log,
		Once: func(ctx context.Context, _ int64) error { _, err := a.runOnce(ctx); return err }}
	return a, nil
}

func (a *AutoArchiver) runOnce(ctx context.Context) (Report, error) {
	rep, err := Archive(ctx, a.db, ArchiveRequest{OlderThan: a.after, By: AutoArchiveBy,
		Why: fmt.Sprintf("failed more than %s ago", a.after)})
	if err != nil {
		return rep, fmt.Errorf("auto-archive: %w", err)
	}
	if len(rep.Events) > 0 {
		a.log.Info().Int("count", len(rep.Events)).Str("ids", FormatIDs(rep.IDs())).Msg("archived old failed rows")
	}
	return rep, nil
}

package harness

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"
)

// The database's health beside wlproj's own figures: a run samples, every
// second or so, what holds the vacuum horizon (horizon.go), the dead rows
// of the tables that churn, and who waits for a lock, then summarises the
// samples per step or per window. A figure of wlproj's from a database
// whose vacuum was held back is not a result.

// healthEveryDefault is the pause between two samples of a HealthWatch.
const healthEveryDefault = time.Second

// HealthConfig says what a HealthWatch samples.
type HealthConfig struct {
	// Prefix starts the application_name of the sessions counted as ours
	// (every wlproj session's starts with "wlproj").
	Prefix string
	// Election starts the application_name of our lock sessions
	// (leader.LockSessionName("")), whose wait for the advisory lock is a
	// standby standing by, counted apart from lock waits.
	Election string
	// Tables are the tables whose dead rows and vacuums are sampled.
	Tables []string
	// Backlog samples the outbox's pending and processing rows too.
	Backlog bool
	// Every is the pause between two samples. Defaults to a second.
	Every time.Duration
}

// HealthSample is the database at one moment.
type HealthSample struct {
	At time.Time
	// Oldest holds the database's horizon; Held is false when nothing did.
	Oldest Horizon
	Held   bool
	// Ours is our oldest snapshot; OursHeld is false when none held one.
	Ours     Snapshot
	OursHeld bool
	Tables   map[string]TableStats
	Locks    LockWaits
	Backlog  int64
	// Err is why the sample failed (Postgres restarting, say); the rest
	// of a failed sample is empty.
	Err error
}

// HealthWatch samples the database until Stop.
type HealthWatch struct {
	stop    chan struct{}
	done    chan struct{}
	mu      sync.Mutex
	samples []HealthSample
}

// WatchHealth starts sampling q's database as cfg says. A failed sample is
// kept with its error and the watch goes on.
func WatchHealth(q Querier, cfg HealthConfig) *HealthWatch {
	w := &HealthWatch{stop: make(chan struct{}), done: make(chan struct{})}
	every := cmp.Or(cfg.Every, healthEveryDefault)
	go func() {
		defer close(w.done)
		sampleEvery(every, w.stop, func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), attemptTimeout)
			s := SampleHealth(ctx, q, cfg)
			cancel()
			w.mu.Lock()
			w.samples = append(w.samples, s)
			w.mu.Unlock()
			return true
		})
	}()
	return w
}

// SampleHealth takes one sample of q's database.
func SampleHealth(ctx context.Context, q Querier, cfg HealthConfig) HealthSample {
	s := HealthSample{At: time.Now()}
	var err error
	if s.Oldest, s.Held, err = OldestHorizon(ctx, q); err != nil {
		return HealthSample{At: s.At, Err: err}
	}
	if s.Ours, s.OursHeld, err = OldestSnapshot(ctx, q, cfg.Prefix); err != nil {
		return HealthSample{At: s.At, Err: err}
	}
	if s.Tables, err = Tables(ctx, q, cfg.Tables...); err != nil {
		return HealthSample{At: s.At, Err: err}
	}
	if s.Locks, err = WaitingForLocks(ctx, q, cfg.Prefix, cfg.Election); err != nil {
		return HealthSample{At: s.At, Err: err}
	}
	if cfg.Backlog {
		if s.Backlog, err = Backlog(ctx, q); err != nil {
			return HealthSample{At: s.At, Err: err}
		}
	}
	return s
}

// Samples are the samples so far; the watch goes on.
func (w *HealthWatch) Samples() []HealthSample {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.samples)
}

// Stop ends the watch and returns every sample it took.
func (w *HealthWatch) Stop() []HealthSample {
	close(w.stop)
	<-w.done
	return w.Samples()
}

// Between are the samples taken in [from, to).
func Between(samples []HealthSample, from, to time.Time) []HealthSample {
	var out []HealthSample
	for _, s := range samples {
		if !s.At.Before(from) && s.At.Before(to) {
			out = append(out, s)
		}
	}
	return out
}

// HealthSummary is what a report says of the database over some samples.
type HealthSummary struct {
	Samples int `json:"samples"`
	// FailedSamples could not be taken (Postgres restarting, say).
	FailedSamples int `json:"failed_samples,omitempty"`
	// FirstFailure is why the first failed sample failed.
	FirstFailure string `json:"first_failure,omitempty"`
	// The oldest horizon seen, by age(xmin), and who held it.
	OldestSeconds float64 `json:"oldest_snapshot_seconds"`
	OldestXIDAge  int64   `json:"oldest_snapshot_xid_age"`
	OldestHolder  string  `json:"oldest_snapshot_holder,omitempty"`
	// The oldest snapshot of our sessions, and whose it was.
	OursSeconds float64 `json:"oldest_wlproj_snapshot_seconds"`
	OursHolder  string  `json:"oldest_wlproj_snapshot_holder,omitempty"`
	// Tables are the dead rows and vacuums of each table sampled.
	Tables map[string]TableSummary `json:"tables"`
	// LockWaitSamples counts the samples in which one of our sessions
	// waited for a lock (the election's wait aside); LockWaiter names the
	// first seen.
	LockWaitSamples int    `json:"lock_wait_samples"`
	LockWaiter      string `json:"lock_waiter,omitempty"`
	// StandbySamples counts the samples in which a standby waited for the
	// leader's lock: the documented pair was running.
	StandbySamples int   `json:"standby_waiting_samples"`
	BacklogMax     int64 `json:"backlog_max,omitempty"`
}

// TableSummary is one table's dead rows over the samples: the highest,
// the lowest and the last count, and the vacuums between the first sample
// and the last.
type TableSummary struct {
	DeadMax     int64 `json:"dead_max"`
	DeadMin     int64 `json:"dead_min"`
	DeadLast    int64 `json:"dead_last"`
	Autovacuums int64 `json:"autovacuums"`
	Vacuums     int64 `json:"vacuums"`
}

// Summarize sums up samples, failed ones counted apart.
func Summarize(samples []HealthSample) HealthSummary {
	h := HealthSummary{Tables: map[string]TableSummary{}}
	first := map[string]TableStats{}
	var oldest Horizon
	for _, s := range samples {
		h.Samples++
		if s.Err != nil {
			h.FailedSamples++
			h.FirstFailure = cmp.Or(h.FirstFailure, s.At.Format(time.RFC3339Nano)+": "+s.Err.Error())
			continue
		}
		if s.Held && (oldest.Who == "" || s.Oldest.XIDAge > oldest.XIDAge) {
			oldest = s.Oldest
		}
		if s.OursHeld && s.Ours.Age.Seconds() > h.OursSeconds {
			h.OursSeconds, h.OursHolder = Round3(s.Ours.Age.Seconds()), s.Ours.String()
		}
		for name, t := range s.Tables {
			h.Tables[name] = tableSummary(h.Tables, first, name, t)
		}
		if s.Locks.Waiting > 0 {
			h.LockWaitSamples++
			h.LockWaiter = cmp.Or(h.LockWaiter, s.Locks.First)
		}
		if s.Locks.Election > 0 {
			h.StandbySamples++
		}
		h.BacklogMax = max(h.BacklogMax, s.Backlog)
	}
	if oldest.Who != "" {
		h.OldestSeconds, h.OldestXIDAge, h.OldestHolder = Round3(oldest.Age.Seconds()), oldest.XIDAge, oldest.Kind+" "+oldest.Who
	}
	return h
}

// tableSummary adds sample t of table name to its summary so far; first
// keeps each table's first sample, which the vacuums are counted from.
func tableSummary(sums map[string]TableSummary, first map[string]TableStats, name string, t TableStats) TableSummary {
	f, seen := first[name]
	if !seen {
		first[name] = t
		return TableSummary{DeadMax: t.Dead, DeadMin: t.Dead, DeadLast: t.Dead}
	}
	sum := sums[name]
	sum.DeadMax, sum.DeadMin, sum.DeadLast = max(sum.DeadMax, t.Dead), min(sum.DeadMin, t.Dead), t.Dead
	sum.Autovacuums, sum.Vacuums = max(0, t.Autovacuums-f.Autovacuums), max(0, t.Vacuums-f.Vacuums)
	return sum
}

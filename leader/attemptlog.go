package leader

import (
	"time"

	"github.com/rs/zerolog"
)

// attemptReminderEvery is how often a streak of failed leadership attempts
// is logged again while it lasts.
const attemptReminderEvery = time.Minute

// attemptLog logs a streak of failed leadership attempts as one outage: its
// first failure, a reminder every attemptReminderEvery while it lasts, and
// its end. An attempt is retried every RetryInterval (0.5 s): a warning for
// each would be two a second per replica for as long as the database is
// away, which an operator learns to ignore.
type attemptLog struct {
	failures   int
	since      time.Time
	remindedAt time.Time
}

// failed records a failed attempt at now, logging it if it starts a streak
// or a reminder is due.
func (a *attemptLog) failed(log zerolog.Logger, err error, now time.Time) {
	a.failures++
	if a.failures == 1 {
		a.since, a.remindedAt = now, now
		log.Warn().Err(err).Msg("leadership attempt failed; retrying, logged again once an attempt gets through or every minute")
		return
	}
	if now.Sub(a.remindedAt) >= attemptReminderEvery {
		a.remindedAt = now
		log.Warn().Err(err).Int("failed_attempts", a.failures).Float64("failing_for_seconds", now.Sub(a.since).Seconds()).
			Msg("leadership attempts still failing; retrying")
	}
}

// reached records an attempt that reached the database at now, and logs
// the end of a streak of failures.
func (a *attemptLog) reached(log zerolog.Logger, now time.Time) {
	if a.failures == 0 {
		return
	}
	log.Info().Int("failed_attempts", a.failures).Float64("failed_for_seconds", now.Sub(a.since).Seconds()).
		Msg("leadership attempts reach the database again")
	*a = attemptLog{}
}

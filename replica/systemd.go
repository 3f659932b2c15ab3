package replica

import (
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
)

// Under systemd (Type=notify) a replica says when it is ready and when it
// stops, and pings the watchdog from the elector's tick. Elsewhere each
// call does nothing.

// tickInterval is the elector's tick: systemd restarts a unit that misses
// WATCHDOG_USEC, so tick twice per window, and at least once a second.
func tickInterval() time.Duration {
	tick := time.Second
	if watchdog, _ := daemon.SdWatchdogEnabled(false); watchdog > 0 {
		tick = min(tick, watchdog/2)
	}
	return tick
}

// watchdogPing is the elector's OnTick under a watchdog; nil without one.
func watchdogPing() func() {
	if watchdog, _ := daemon.SdWatchdogEnabled(false); watchdog > 0 {
		return func() { _, _ = daemon.SdNotify(false, daemon.SdNotifyWatchdog) }
	}
	return nil
}

func notifyReady() { _, _ = daemon.SdNotify(false, daemon.SdNotifyReady) }

func notifyStopping() { _, _ = daemon.SdNotify(false, daemon.SdNotifyStopping) }

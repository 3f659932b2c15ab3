package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/wlproj/wlproj/internal/testkit/faultproxy"
	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/projection"
)

// NetDelayConfig is the network-delay step's part of Config.
type NetDelayConfig struct {
	// Docs is the backlog each run drains.
	Docs int
	// Rounds is how many times every setting is run, every other round in
	// reverse order; the figures are the medians.
	Rounds int
	// Delays are the one-way delays the proxy adds, each way.
	Delays []time.Duration
}

func defaultNetDelayConfig() NetDelayConfig {
	return NetDelayConfig{Docs: 40_000, Rounds: 5, Delays: []time.Duration{0, 5 * time.Millisecond, 20 * time.Millisecond}}
}

func (c NetDelayConfig) smoke() NetDelayConfig {
	c.Docs, c.Rounds, c.Delays = 3000, 1, []time.Duration{0, netDelayGoalAt}
	return c
}

func (c *NetDelayConfig) flags(fs *flag.FlagSet) {
	fs.IntVar(&c.Docs, "netdelay-docs", c.Docs, "events each run of the network-delay step drains")
	fs.IntVar(&c.Rounds, "netdelay-rounds", c.Rounds, "times every delay and setting is run in the network-delay step")
	fs.Func("netdelay-ms", "comma-separated one-way delays of the network-delay step, in ms (default 0,5,20)", func(s string) error {
		var ds []time.Duration
		for _, f := range strings.Split(s, ",") {
			ms, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || ms < 0 || ms > 1000 {
				return fmt.Errorf("%q is not a delay in [0, 1000] ms", f)
			}
			ds = append(ds, time.Duration(ms)*time.Millisecond)
		}
		c.Delays = ds
		return nil
	})
}

func (c NetDelayConfig) validate() error {
	switch {
	case c.Docs < 1 || c.Docs > 100_000_000:
		return fmt.Errorf("-netdelay-docs=%d is out of range [1, 100000000]", c.Docs)
	case c.Rounds < 1 || c.Rounds > 100:
		return fmt.Errorf("-netdelay-rounds=%d is out of range [1, 100]", c.Rounds)
	case len(c.Delays) == 0:
		return fmt.Errorf("-netdelay-ms is empty")
	}
	return nil
}

// netDelaySettings is what an operator sets for the engine's distance: bulk
// size (which is also the claim batch) and bulk requests in flight.
type netDelaySettings struct {
	BulkSize    int `json:"bulk_size"`
	Concurrency int `json:"concurrency"`
}

func (s netDelaySettings) env() []string {
	return []string{"OUTBOX_BULK_SIZE=" + strconv.Itoa(s.BulkSize), "OUTBOX_CONCURRENCY=" + strconv.Itoa(s.Concurrency)}
}

// netDelayRecommended is the runbook's latency table (runbook.md, "The
// engine far away"), from the nearest engine to the farthest: the first row
// whose UpTo is at or above the one-way delay applies. A test keeps the two
// equal.
var netDelayRecommended = []struct {
	UpTo time.Duration
	netDelaySettings
}{
	{time.Millisecond, netDelaySettings{projection.BulkSizeDefault, projection.ConcurrencyDefault}},
	{5 * time.Millisecond, netDelaySettings{500, 3}},
	{20 * time.Millisecond, netDelaySettings{1000, 4}},
	{50 * time.Millisecond, netDelaySettings{1000, 8}},
}

// recommendedFor is the runbook's settings for one-way delay d.
func recommendedFor(d time.Duration) netDelaySettings {
	for _, r := range netDelayRecommended {
		if d <= r.UpTo {
			return r.netDelaySettings
		}
	}
	return netDelayRecommended[len(netDelayRecommended)-1].netDelaySettings
}

// NetDelay is step 15: the backlog drained end to end through the fault
// proxy at each one-way delay, with the default settings and with the
// runbook's for that delay.
type NetDelay struct {
	Docs   int `json:"docs"`
	Rounds int `json:"rounds"`
	// JitterFraction of each delay is added at random, each way.
	JitterFraction float64       `json:"jitter_fraction"`
	Runs           []NetDelayRun `json:"runs"`
	// ZeroEventsPerSec is the median at 0 ms with the defaults: what the
	// others are compared with.
	ZeroEventsPerSec float64 `json:"zero_delay_events_per_sec"`
}

// NetDelayRun is one delay and one set of settings, over the rounds.
type NetDelayRun struct {
	DelayMs  float64 `json:"one_way_delay_ms"`
	Settings string  `json:"settings"` // "default" or "recommended"
	netDelaySettings
	EventsPerSec       []float64 `json:"events_per_sec"`
	MedianEventsPerSec float64   `json:"median_events_per_sec"`
	// ToZero is the median over the rounds of this run's rate over the 0
	// ms default run's of the same round: on a shared machine the rate
	// drifts more between rounds than between neighbours.
	ToZero float64 `json:"to_zero_delay"`
}

// netDelayJitter is the jitter as a fraction of the delay: a WAN link's
// latency wanders a little around its base.
const netDelayJitter = 0.1

// The goal: at netDelayGoalAt one way, with the recommended
// settings, at least netDelayGoal of the 0 ms rate.
const (
	netDelayGoal   = 0.8
	netDelayGoalAt = 20 * time.Millisecond
)

// 15. End to end through a slow network.
func (b *bench) netDelay(ctx context.Context) error {
	cfg := b.cfg.NetDelay
	proxy, err := faultproxy.New(b.cfg.ElasticURL)
	if err != nil {
		return err
	}
	defer proxy.Close()
	nd := &NetDelay{Docs: cfg.Docs, Rounds: cfg.Rounds, JitterFraction: netDelayJitter}
	defaults := netDelaySettings{projection.BulkSizeDefault, projection.ConcurrencyDefault}
	nd.Runs = netDelayRuns(cfg.Delays, defaults)
	// The engine's first bulks into a new index run slower (its JIT, its
	// caches): a drain nobody counts goes first, at 0 ms.
	if !b.cfg.Smoke {
		proxy.SetDelay(0, 0)
		if _, err := b.netDelayRun(ctx, proxy.URL(), defaults, min(cfg.Docs, 20_000)); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	for round := range cfg.Rounds {
		order := make([]int, len(nd.Runs))
		for i := range order {
			order[i] = i
		}
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, i := range order {
			run := &nd.Runs[i]
			d := time.Duration(run.DelayMs * float64(time.Millisecond))
			proxy.SetDelay(d, time.Duration(float64(d)*netDelayJitter))
			rate, err := b.netDelayRun(ctx, proxy.URL(), run.netDelaySettings, cfg.Docs)
			if err != nil {
				return fmt.Errorf("%g ms, %s settings: %w", run.DelayMs, run.Settings, err)
			}
			run.EventsPerSec = append(run.EventsPerSec, rate)
			b.say("network delay %g ms each way, %s settings (bulk %d, concurrency %d): %.0f events/s",
				run.DelayMs, run.Settings, run.BulkSize, run.Concurrency, rate)
		}
	}
	nd.finish()
	b.rep.NetDelay = nd
	return nil
}

// netDelayRun drains a fresh backlog of n events through the proxy at
// engineURL with settings s and returns the events per second, from the
// lock taken to the last ack (Postgres' clock, as step 2).
func (b *bench) netDelayRun(ctx context.Context, engineURL string, s netDelaySettings, n int) (float64, error) {
	if err := b.deleteIndex(ctx, b.index); err != nil {
		return 0, err
	}
	if err := b.createIndex(ctx, b.index); err != nil {
		return 0, err
	}
	if err := b.reset(ctx); err != nil {
		return 0, err
	}
	if err := b.loadEvents(ctx, 0, n, ""); err != nil {
		return 0, err
	}
	if err := b.vacuum(ctx); err != nil {
		return 0, err
	}
	r, t0, err := b.startLeader(ctx, "netdelay", append(s.env(), "ELASTIC_URL="+engineURL)...)
	if err != nil {
		return 0, err
	}
	if err := waitProcessed(ctx, r, n, b.drainTimeout(n)); err != nil {
		return 0, err
	}
	last, failed, err := b.waitDrained(ctx, stepTimeout)
	b.stopReplicas()
	if err != nil {
		return 0, err
	}
	if failed > 0 {
		return 0, fmt.Errorf("%d events failed", failed)
	}
	docs, err := harness.DocCount(ctx, b.cfg.ElasticURL, b.index)
	if err != nil {
		return 0, err
	}
	if docs != n {
		return 0, fmt.Errorf("index holds %d documents, want %d", docs, n)
	}
	return round1(float64(n) / last.Sub(t0).Seconds()), nil
}

// netDelayRuns lists the runs of one round: each delay with the defaults
// and, where the runbook differs, with its settings. The 0 ms default run
// comes first and the goal's run right after it, so that they are
// neighbours in every round, reversed or not.
func netDelayRuns(delays []time.Duration, defaults netDelaySettings) []NetDelayRun {
	var runs []NetDelayRun
	for _, d := range delays {
		runs = append(runs, NetDelayRun{DelayMs: ms(d), Settings: "default", netDelaySettings: defaults})
		if rec := recommendedFor(d); rec != defaults {
			runs = append(runs, NetDelayRun{DelayMs: ms(d), Settings: "recommended", netDelaySettings: rec})
		}
	}
	rank := func(r NetDelayRun) int {
		switch {
		case r.DelayMs == 0 && r.Settings == "default":
			return 0
		case r.DelayMs == ms(netDelayGoalAt) && (r.Settings == "recommended" || recommendedFor(netDelayGoalAt) == defaults):
			return 1
		}
		return 2
	}
	slices.SortStableFunc(runs, func(a, b NetDelayRun) int { return rank(a) - rank(b) })
	return runs
}

func (nd *NetDelay) finish() {
	var zero []float64
	for i := range nd.Runs {
		r := &nd.Runs[i]
		r.MedianEventsPerSec = round1(median(r.EventsPerSec))
		if r.DelayMs == 0 && r.Settings == "default" {
			nd.ZeroEventsPerSec, zero = r.MedianEventsPerSec, r.EventsPerSec
		}
	}
	for i := range nd.Runs {
		r := &nd.Runs[i]
		var ratios []float64
		for round, v := range r.EventsPerSec {
			if round < len(zero) && zero[round] > 0 {
				ratios = append(ratios, v/zero[round])
			}
		}
		r.ToZero = harness.Round3(median(ratios))
	}
}

// goalRun is the run the goal judges: netDelayGoalAt with the runbook's
// settings (the defaults if the runbook keeps them there); nil if that
// delay was not measured.
func (nd *NetDelay) goalRun() *NetDelayRun {
	var goal *NetDelayRun
	for i := range nd.Runs {
		if r := &nd.Runs[i]; r.DelayMs == ms(netDelayGoalAt) && (goal == nil || r.Settings == "recommended") {
			goal = r
		}
	}
	return goal
}

func netDelayTargets(r *Report, add addTarget) {
	nd := r.NetDelay
	if nd == nil || nd.ZeroEventsPerSec == 0 {
		return
	}
	if g := nd.goalRun(); g != nil {
		add(fmt.Sprintf("end to end at %g ms one-way delay, %s settings / at 0 ms", g.DelayMs, g.Settings),
			fmt.Sprintf(">= %g", netDelayGoal), g.ToZero, "ratio", g.ToZero >= netDelayGoal)
	}
}

func netDelayRows(r *Report, tw io.Writer) {
	nd := r.NetDelay
	if nd == nil {
		return
	}
	for _, run := range nd.Runs {
		rates := make([]string, len(run.EventsPerSec))
		for i, v := range run.EventsPerSec {
			rates[i] = fmt.Sprintf("%.0f", v)
		}
		fmt.Fprintf(tw, "15 network delay %g ms, %s (bulk %d, concurrency %d)\tmedian %.0f/s of %d events (runs %s), %.2fx the 0 ms rate\t\n",
			run.DelayMs, run.Settings, run.BulkSize, run.Concurrency, run.MedianEventsPerSec, nd.Docs, strings.Join(rates, ", "), run.ToZero)
	}
}

package leader

import (
	"context"
	"fmt"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/wlproj/wlproj/internal/metrichelp"
)

// The reasons a replica that could take the lock refuses to lead: the label
// of outbox_leader_refused.
const (
	// ReasonNotNewestPrimary: another host DatabaseURL lists is a primary
	// on a timeline as new as the lock connection's server, or newer.
	ReasonNotNewestPrimary = "not_newest_primary"
	// ReasonPoolOnOtherServer: the replica's pool reaches another server
	// than its lock connection.
	ReasonPoolOnOtherServer = "pool_on_other_server"
)

// probeSessionPrefix starts the application_name of the short connections
// that ask each listed host what it is.
const probeSessionPrefix = "wlproj-probe:"

func init() {
	metrichelp.Describe(map[string]string{
		"outbox_leader_refused": "1 while this replica refuses to lead, by reason: not_newest_primary (another listed host " +
			"is a primary on a timeline as new or newer), pool_on_other_server (its pool and its lock connection reach two servers).",
	})
}

var refusedGauges = map[string]*metrics.Gauge{
	ReasonNotNewestPrimary:  metrics.NewGauge(`outbox_leader_refused{reason="`+ReasonNotNewestPrimary+`"}`, nil),
	ReasonPoolOnOtherServer: metrics.NewGauge(`outbox_leader_refused{reason="`+ReasonPoolOnOtherServer+`"}`, nil),
}

// Refusal is why a replica that could take the lock does not lead: Postgres
// has split, and leading on either side could write where the application
// no longer looks, or claim from one server while the lock sits on another.
type Refusal struct {
	// Reason is one of the Reason constants.
	Reason string
	// Detail names both servers, for people.
	Detail string
}

func (r *Refusal) Error() string { return "refusing to lead: " + r.Detail }

// judge is what the lock connection's server, the pool's servers and the
// listed hosts' answers say: nil when this replica may lead on lock. Hosts
// that did not answer count for nothing: a host that is down is no second
// primary.
func judge(lock Server, pool []Server, probes []probe) *Refusal {
	for _, s := range pool {
		if !s.Same(lock) {
			return &Refusal{Reason: ReasonPoolOnOtherServer, Detail: fmt.Sprintf(
				"the pool reaches %s but the lock connection %s: Postgres has split or moved, and claims "+
					"would run on one server while the lock and the epoch are on the other", s, lock)}
		}
	}
	for _, p := range probes {
		if p.err != nil || !p.server.Primary || p.server.Same(lock) || p.server.Timeline < lock.Timeline {
			continue
		}
		return &Refusal{Reason: ReasonNotNewestPrimary, Detail: fmt.Sprintf(
			"listed host %s, as new as or newer than the lock connection's server %s: two primaries "+
				"(an old primary back as a primary?); fence the old one or take it out of DATABASE_URL", p.server.as(p.host), lock)}
	}
	return nil
}

// findSplit asks the pool and every listed host where they are, within
// CheckTimeout, and judges.
func (e *Elector) findSplit(ctx context.Context, lock Server) *Refusal {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.CheckTimeout)
	defer cancel()
	var pool []Server
	poolDone := make(chan struct{})
	go func() {
		defer close(poolDone)
		if e.PoolServers != nil {
			// A failed read is no evidence of a split; the servers read are.
			pool, _ = e.PoolServers(ctx)
		}
	}()
	probes, err := e.probeHosts(ctx)
	<-poolDone
	if err != nil {
		e.log.Warn().Err(err).Msg("cannot probe the database hosts")
	}
	return judge(lock, pool, probes)
}

// refuse records r, or with nil that the last check found no split: the
// gauges, and an error line when the refusal starts or changes.
func (e *Elector) refuse(r *Refusal) {
	for reason, g := range refusedGauges {
		if r != nil && r.Reason == reason {
			g.Set(1)
		} else {
			g.Set(0)
		}
	}
	switch {
	case r != nil && (e.refusal == nil || *r != *e.refusal):
		e.log.Error().Str("reason", r.Reason).Msg(r.Error())
	case r == nil && e.refusal != nil:
		e.log.Info().Msg("no split any more: campaigning for leadership again")
	}
	e.refusal = r
	e.mu.Lock()
	e.state.Refused = ""
	if r != nil {
		e.state.Refused = r.Reason
	}
	e.mu.Unlock()
}

// splitWatch runs findSplit aside, every due tick, while the replica leads
// or waits for the lock, so the loop keeps checking its lock connection and
// ticking while hosts are asked.
type splitWatch struct {
	due     *time.Ticker
	result  chan *Refusal
	running bool
}

func (e *Elector) newSplitWatch(every time.Duration) *splitWatch {
	return &splitWatch{due: time.NewTicker(every), result: make(chan *Refusal, 1)}
}

// start runs one check unless one still runs.
func (w *splitWatch) start(ctx context.Context, e *Elector, lock Server) {
	if w.running {
		return
	}
	w.running = true
	go func() { w.result <- e.findSplit(ctx, lock) }()
}

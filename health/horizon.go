package health

import (
	"fmt"
	"strconv"
	"sync"

	"github.com/VictoriaMetrics/metrics"

	"github.com/wlproj/wlproj/internal/metrichelp"
	"github.com/wlproj/wlproj/outbox"
)

func init() {
	metrichelp.Describe(map[string]string{
		"outbox_db_horizon_age_seconds": "How long the oldest snapshot or transaction id held in the outbox's database has been held; vacuum of every table there, the outbox first, removes no row deleted since. " +
			"From its transaction's start where Postgres shows it, else since this replica first saw it; 0 when none is held.",
		"outbox_db_horizon_age_transactions": "How many transactions ago the oldest xmin held in the outbox's database was taken (age(xid)); 0 when none is held.",
		"outbox_db_horizon_holder_pid": "One series naming who holds the oldest xmin of the outbox's database: kind (backend, walsender, replication_slot, prepared_xact or none), wlproj (true for a wlproj session), application_name, state, slot. " +
			"Its value is the holder's backend pid, 0 when it has none.",
		"outbox_table_dead_tuples":                       "Dead row versions of the table (n_dead_tup): what vacuum has yet to remove, or cannot while something holds the horizon.",
		"outbox_table_live_tuples":                       "Live rows of the table (n_live_tup), the statistics' estimate.",
		"outbox_table_last_autovacuum_timestamp_seconds": "When autovacuum last finished on the table, in Unix time; 0 if never since the statistics were reset.",
	})
}

// labelValueMax bounds the free-text labels of the holder series: an
// application_name can be 63 bytes, a slot name 63.
const labelValueMax = 64

// horizonGauges are the horizon's series. The holder series' labels change
// with the holder, so it is re-registered under its new name and the old one
// dropped: one series at a time, whose label values come from a small set
// (kinds, states, the application names and slots of one database), while
// the pid, which changes with every session, is its value. Like the
// registry it lives in, it is one for the process.
type horizonGauges struct {
	mu                          sync.Mutex
	ageSeconds, ageTransactions *metrics.Gauge
	holderName                  string
}

var (
	horizonOnce   sync.Once
	horizonSeries *horizonGauges
)

func newHorizonGauges() *horizonGauges {
	horizonOnce.Do(func() {
		horizonSeries = &horizonGauges{
			ageSeconds:      metrics.GetOrCreateGauge(`outbox_db_horizon_age_seconds`, nil),
			ageTransactions: metrics.GetOrCreateGauge(`outbox_db_horizon_age_transactions`, nil),
		}
	})
	return horizonSeries
}

// set exports one reading.
func (g *horizonGauges) set(h outbox.Horizon) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.ageSeconds.Set(h.Age.Seconds())
	var xids float64
	var pid int32
	if h.Holder != nil {
		xids, pid = float64(h.Holder.XidAge), h.Holder.PID
	}
	g.ageTransactions.Set(xids)
	name := holderSeries(h)
	if name != g.holderName {
		if g.holderName != "" {
			metrics.UnregisterMetric(g.holderName)
		}
		g.holderName = name
	}
	metrics.GetOrCreateGauge(name, nil).Set(float64(pid))
	for _, t := range h.Tables {
		label := fmt.Sprintf(`{table=%q}`, t.Table)
		metrics.GetOrCreateGauge(`outbox_table_dead_tuples`+label, nil).Set(float64(t.Dead))
		metrics.GetOrCreateGauge(`outbox_table_live_tuples`+label, nil).Set(float64(t.Live))
		var last float64
		if !t.LastAutovacuum.IsZero() {
			last = float64(t.LastAutovacuum.UnixMilli()) / 1000
		}
		metrics.GetOrCreateGauge(`outbox_table_last_autovacuum_timestamp_seconds`+label, nil).Set(last)
	}
}

// holderSeries is the holder series' name with its labels. A label Postgres
// hides from this role is "unknown"; one that does not apply is empty.
func holderSeries(h outbox.Horizon) string {
	hd := outbox.HorizonHolder{Kind: outbox.HolderNone}
	if h.Holder != nil {
		hd = *h.Holder
	}
	state, slot := hd.State, ""
	switch hd.Kind {
	case outbox.HolderBackend, outbox.HolderWalsender:
		if state == "" {
			state = "unknown"
		}
	case outbox.HolderSlot:
		slot = hd.Name
	}
	return fmt.Sprintf(`outbox_db_horizon_holder_pid{kind=%q,wlproj=%q,application_name=%q,state=%q,slot=%q}`,
		hd.Kind, strconv.FormatBool(hd.Wlproj()), truncate(hd.Application), state, truncate(slot))
}

func truncate(s string) string {
	if len(s) > labelValueMax {
		return s[:labelValueMax]
	}
	return s
}

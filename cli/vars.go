package cli

import (
	"strconv"
	"strings"
	"time"

	"github.com/wlproj/wlproj/console"
	"github.com/wlproj/wlproj/consume"
	"github.com/wlproj/wlproj/health"
	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/leader"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
	"github.com/wlproj/wlproj/replay"
	"github.com/wlproj/wlproj/replica"
	"github.com/wlproj/wlproj/verify"
)

// listLimitDefault is how many events failed list shows unless told.
const listLimitDefault = 100

// A flag's default and range, from its package.
type (
	intVar struct {
		def int
		rng bounds.Range[int]
	}
	durationVar struct {
		def time.Duration
		rng bounds.Range[time.Duration]
	}
)

// intVars are the ${name} and ${name_range} of the integer flags.
var intVars = map[string]intVar{
	"bulk_size":                   {projection.BulkSizeDefault, projection.BulkSizeRange},
	"concurrency":                 {projection.ConcurrencyDefault, projection.ConcurrencyRange},
	"max_attempts":                {consume.MaxAttemptsDefault, consume.MaxAttemptsRange},
	"max_payload_bytes":           {projection.MaxPayloadBytesDefault, projection.MaxPayloadBytesRange},
	"chronicle_max_payload_bytes": {projection.ChronicleMaxPayloadBytesDefault, projection.ChronicleMaxPayloadBytesRange},
	"keepalives_count":            {leader.KeepalivesCountDefault, leader.KeepalivesCountRange},
	"auto_replay_per_minute":      {replay.PerMinuteDefault, replay.PerMinuteRange},
	"verify_sample":               {verify.SampleDefault, verify.SampleRange},
	"verify_repair_max":           {verify.RepairMaxDefault, verify.RepairMaxRange},
	"verify_rate":                 {verify.RateDefault, verify.ServiceRateRange},
}

// secondsVars are the ${name} and ${name_range} of the flags in seconds.
var secondsVars = map[string]durationVar{
	"elastic_timeout":     {projection.TimeoutDefault, projection.TimeoutRange},
	"poll_interval":       {consume.PollIntervalDefault, consume.PollIntervalRange},
	"lease":               {consume.LeaseDefault, consume.LeaseRange},
	"reclaim_interval":    {consume.ReclaimIntervalDefault, consume.ReclaimIntervalRange},
	"max_processing":      {outbox.MaxProcessingDefault, outbox.MaxProcessingRange},
	"base_backoff":        {consume.BaseBackoffDefault, consume.BaseBackoffRange},
	"max_backoff":         {consume.MaxBackoffDefault, consume.MaxBackoffRange},
	"shutdown_grace":      {consume.ShutdownGraceDefault, consume.ShutdownGraceRange},
	"claim_cooldown":      {consume.ClaimCooldownDefault, consume.ClaimCooldownRange},
	"check_interval":      {leader.CheckIntervalDefault, leader.CheckIntervalRange},
	"check_timeout":       {leader.CheckTimeoutDefault, leader.CheckTimeoutRange},
	"keepalives_idle":     {leader.KeepalivesIdleDefault, leader.KeepalivesIdleRange},
	"keepalives_interval": {leader.KeepalivesIntervalDefault, leader.KeepalivesIntervalRange},
}

// durationVars are the ${name} and ${name_range} of the flags that take a
// Go duration (168h); a zero default leaves ${name} out.
var durationVars = map[string]durationVar{
	"retention":           {consume.RetentionDefault, consume.RetentionRange},
	"tombstone_retention": {consume.TombstoneRetentionDefault, consume.TombstoneRetentionRange},
	"archive_after":       {0, replay.ArchiveAfterRange},
	"console_session_ttl": {console.SessionTTLDefault, console.SessionTTLRange},
	"verify_interval":     {0, verify.IntervalRange},
	"unknown_wait":        {consume.UnknownWaitDefault, consume.UnknownWaitRange},
}

// flagVars fills the ${…} of the flags' tags from the packages' defaults
// and ranges.
func flagVars() map[string]string {
	v := map[string]string{
		"leader_name":        leader.NameDefault,
		"http_addr":          health.AddrDefault,
		"http_port":          strconv.Itoa(health.HTTPPortDefault),
		"port_range":         rangeText(health.PortRange),
		"console_addr":       console.AddrDefault,
		"console_port_range": rangeText(console.PortRange),
		"list_limit":         strconv.Itoa(listLimitDefault),
		"replay_max":         strconv.Itoa(replay.MaxDefault),
		"projections":        strings.Join(replica.ProjectionNames(), ", "),
		"projections_or":     strings.Join(replica.ProjectionNames(), " or "),
		"search_projection":  projection.SearchName,
		"elastic_index":      projection.IndexDefault,
	}
	v["console_oidc_callback"] = console.OIDCCallbackPath
	v["console_oidc_username_claim"] = console.OIDCUsernameClaimDefault
	v["console_oidc_groups_claim"] = console.OIDCGroupsClaimDefault
	v["console_oidc_scopes"] = strings.Join(console.OIDCScopesDefault, ",")
	for name, s := range intVars {
		v[name], v[name+"_range"] = strconv.Itoa(s.def), rangeText(s.rng)
	}
	for name, s := range secondsVars {
		v[name], v[name+"_range"] = secondsText(s.def), secondsText(s.rng.Min)+", "+secondsText(s.rng.Max)
	}
	for name, s := range durationVars {
		if s.def != 0 {
			v[name] = durationText(s.def)
		}
		v[name+"_range"] = durationText(s.rng.Min) + ", " + durationText(s.rng.Max)
	}
	return v
}

func rangeText(r bounds.Range[int]) string { return strconv.Itoa(r.Min) + ", " + strconv.Itoa(r.Max) }

func secondsText(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'g', -1, 64) }

// durationText is d as an operator writes it: 168h, not 168h0m0s.
func durationText(d time.Duration) string {
	s := d.String()
	for _, zero := range []string{"0s", "0m"} {
		if t, ok := strings.CutSuffix(s, zero); ok && len(t) > 0 && (t[len(t)-1] < '0' || t[len(t)-1] > '9') {
			s = t
		}
	}
	return s
}

func seconds(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }

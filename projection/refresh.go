package projection

import "maps"

// RefreshIntervalDefault is the index.refresh_interval of an index wlproj
// creates (EnsureIndex, a rebuild's target) when its mapping file sets
// none: the engine's own default, but set. Left unset, an index goes
// "search idle" after 30 s without a search: its shard stops refreshing
// and keeps every write since in memory, until a search or full buffers
// refresh them all at once. In the soak (2,000 events/s, nobody
// searching) that refresh held the bulks for a second every 40 s, and
// the lag p99 of those windows was 386 to 445 ms; with the interval set,
// each refresh takes a second's writes.
const RefreshIntervalDefault = "1s"

// RefreshInterval is the index.refresh_interval a create-index body sets,
// nil when it sets none; every form of the setting counts ("index":
// {"refresh_interval"}, "index.refresh_interval", "refresh_interval").
func RefreshInterval(body map[string]any) any {
	settings, _ := body["settings"].(map[string]any)
	if v, ok := settings["index.refresh_interval"]; ok {
		return v
	}
	if v, ok := settings["refresh_interval"]; ok {
		return v
	}
	index, _ := settings["index"].(map[string]any)
	return index["refresh_interval"]
}

// WithRefreshInterval is body (nil: none) with RefreshIntervalDefault when
// it sets no refresh interval of its own; body itself is left as it was.
func WithRefreshInterval(body map[string]any) map[string]any {
	if RefreshInterval(body) != nil {
		return maps.Clone(body)
	}
	return WithRefreshIntervalOf(body, RefreshIntervalDefault)
}

// WithRefreshIntervalOf is body (nil: none) with index.refresh_interval
// set to v, in place of any form of it body has; body is left as it was.
func WithRefreshIntervalOf(body map[string]any, v any) map[string]any {
	out := maps.Clone(body)
	if out == nil {
		out = map[string]any{}
	}
	settings, _ := out["settings"].(map[string]any)
	settings = maps.Clone(settings)
	if settings == nil {
		settings = map[string]any{}
	}
	delete(settings, "index.refresh_interval")
	delete(settings, "refresh_interval")
	index, _ := settings["index"].(map[string]any)
	index = maps.Clone(index)
	if index == nil {
		index = map[string]any{}
	}
	index["refresh_interval"] = v
	settings["index"] = index
	out["settings"] = settings
	return out
}

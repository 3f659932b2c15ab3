// Package health serves what every replica, leader or standby, exposes:
// /healthz (liveness: the main loop ticked recently), /readyz (readiness: not
// draining, database reachable, its schema at least the version this binary
// needs, and the engine reachable when required) and
// /metrics (Prometheus text, lint-clean for promtool). It also refreshes the
// outbox gauges from the database: every GaugeInterval on the leader, every
// StandbyGaugeInterval on a standby. Among them is the database's vacuum
// horizon (who holds the oldest snapshot, how old it is) and the dead rows
// of the outbox and the ledger: wlproj lives in the application's database,
// and a snapshot held there by anyone stops vacuum of the outbox first. It
// reads the schema version every SchemaInterval, whose verdict the elector
// asks before it campaigns (SchemaOK).
package health

package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ProjectionsAgreement is this replica's projections hash beside the one
// its leader recorded (RecordProjectionsSQL): /readyz, the console and the
// outbox_projections_agree gauge all show it, so they all read it here.
type ProjectionsAgreement struct {
	// Hash is this replica's (replica.Specs.Hash).
	Hash string
	// Leader is the leader's; "" when none is known: no replica has led
	// under the name yet, the leader runs a binary before schema 22, or the
	// schema is older than 22.
	Leader string
}

// Agree is false only when both hashes are known and differ. A leader that
// recorded none is no evidence of a difference, and alerting on it would
// fire through every upgrade from a binary that records none.
func (a ProjectionsAgreement) Agree() bool { return a.Leader == "" || a.Leader == a.Hash }

// undefinedTable is the SQLSTATE of a schema before 22, which has no
// outbox_leader_projections: this binary runs on 21 (migrations.RequiredVersion).
const undefinedTable = "42P01"

// LeaderProjections reads the projections hash the leader of name
// recorded; "" when none is known (see ProjectionsAgreement.Leader),
// including on a schema before 22, where nothing records one: the gauge
// poller reads it every few seconds, and that is no fault to log.
func LeaderProjections(ctx context.Context, db Querier, name string) (string, error) {
	var hash *string
	err := db.QueryRow(ctx, LeaderProjectionsSQL, name).Scan(&hash)
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows), errors.As(err, &pgErr) && pgErr.Code == undefinedTable:
		return "", nil
	case err != nil:
		return "", fmt.Errorf("leader projections of %s: %w", name, err)
	case hash == nil:
		return "", nil
	}
	return *hash, nil
}

// CompareProjections reads the hash the leader of name recorded and sets
// it beside hash, this replica's.
func CompareProjections(ctx context.Context, db Querier, name, hash string) (ProjectionsAgreement, error) {
	leader, err := LeaderProjections(ctx, db, name)
	return ProjectionsAgreement{Hash: hash, Leader: leader}, err
}

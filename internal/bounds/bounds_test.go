package bounds

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestCheckNamesTheFieldAndRange(t *testing.T) {
	require.NoError(t, Check("BulkSize", 1, Range[int]{1, 10000}))
	require.NoError(t, Check("BulkSize", 10000, Range[int]{1, 10000}))
	err := Check("BulkSize", 0, Range[int]{1, 10000})
	require.EqualError(t, err, "BulkSize=0 is out of range [1, 10000]")
}

func TestRenameUsesTheOperatorsNameAndSeconds(t *testing.T) {
	names := map[string]string{"Lease": "OUTBOX_LEASE_SECONDS", "MaxBackoff": "OUTBOX_MAX_BACKOFF_SECONDS", "BaseBackoff": "OUTBOX_BASE_BACKOFF_SECONDS"}
	err := fmt.Errorf("consume: %w", Check("Lease", 500*time.Millisecond, Range[time.Duration]{time.Second, time.Hour}))
	require.EqualError(t, Rename(err, names), "OUTBOX_LEASE_SECONDS=0.5 is out of range [1, 3600]")

	err = NotBelow("MaxBackoff", time.Second, "BaseBackoff", 2*time.Second)
	require.EqualError(t, Rename(err, names), "OUTBOX_MAX_BACKOFF_SECONDS=1 must not be below OUTBOX_BASE_BACKOFF_SECONDS=2")

	require.EqualError(t, Rename(Invalid("Limit", "must not be negative, got %d", -1), map[string]string{"Limit": "--limit"}),
		"--limit must not be negative, got -1")

	require.EqualError(t, Rename(Check("Retention", time.Duration(0), Range[time.Duration]{time.Second, time.Hour}),
		map[string]string{"Retention": "OUTBOX_RETENTION"}), "OUTBOX_RETENTION=0s is out of range [1s, 1h0m0s]",
		"a duration flag keeps its unit")

	require.EqualError(t, Rename(Exclusive("APIKey", "use one way to authenticate", "Username", "Password"),
		map[string]string{"APIKey": "ELASTIC_API_KEY", "Username": "ELASTIC_USERNAME", "Password": "ELASTIC_PASSWORD"}),
		"ELASTIC_API_KEY cannot be used with ELASTIC_USERNAME or ELASTIC_PASSWORD: use one way to authenticate")

	other := errors.New("unrelated")
	require.Equal(t, other, Rename(other, names))
	require.EqualError(t, Rename(Check("Unknown", 3, Range[int]{0, 1}), names), "Unknown=3 is out of range [0, 1]")
}

func TestFirstKeepsDeclarationOrder(t *testing.T) {
	a, b := errors.New("a"), errors.New("b")
	require.Equal(t, a, First(nil, a, b))
	require.NoError(t, First(nil, nil))
}

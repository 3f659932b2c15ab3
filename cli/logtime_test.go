package cli

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Log lines are stamped to the millisecond: a takeover, a batch and
// an ack happen within milliseconds of each other.
func TestLogLinesAreStampedToTheMillisecond(t *testing.T) {
	var buf bytes.Buffer
	log := newLogger("json", "info", &buf)
	log.Info().Msg("x")
	var line struct{ Time string }
	require.NoError(t, json.Unmarshal(buf.Bytes(), &line), buf.String())
	require.Regexp(t, `^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}(Z|[+-]\d\d:\d\d)$`, line.Time)
	stamped, err := time.Parse(time.RFC3339Nano, line.Time)
	require.NoError(t, err)
	require.WithinDuration(t, time.Now(), stamped, 5*time.Second)
}

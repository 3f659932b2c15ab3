package e2e

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/buildinfo"
	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// A running replica says which build it is in its first log line (the
// object `wlproj version --json` prints) and in wlproj_build_info.
func TestBuildInfoOfARunningReplica(t *testing.T) {
	t.Parallel()
	out, err := exec.Command(harness.Binary(t), "version", "--json").Output()
	require.NoError(t, err)
	var want buildinfo.Info
	require.NoError(t, json.Unmarshal(out, &want))
	require.NotEmpty(t, want.Version)
	require.NotEmpty(t, want.GoVersion)

	c := newCluster(t)
	r := c.start("a")
	first, _, _ := strings.Cut(strings.TrimSpace(r.Logs()), "\n")
	var line struct {
		Level string         `json:"level"`
		Build buildinfo.Info `json:"build"`
	}
	require.NoError(t, json.Unmarshal([]byte(first), &line), "the first log line is JSON: %s", first)
	require.Equal(t, "info", line.Level)
	require.Equal(t, want, line.Build, "first line: %s", first)

	v, ok, err := harness.ParseMetric(opScrape(t, r),
		`wlproj_build_info{version="`+want.Version+`",revision="`+want.Revision+`",goversion="`+want.GoVersion+`"}`)
	require.NoError(t, err)
	require.True(t, ok, "wlproj_build_info with the binary's version, commit and Go version")
	require.Equal(t, 1.0, v)
}

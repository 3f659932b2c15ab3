package cli

import (
	"bytes"
	"encoding/json"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/buildinfo"
)

func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = Run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestVersionFlagPrintsOneLine(t *testing.T) {
	t.Parallel()
	want := buildinfo.Get()
	for _, args := range [][]string{
		{"--version"},
		{"version"},
		// Before any command's required flags are checked.
		{"replay", "--version"},
	} {
		code, out, errOut := runCLI(t, args...)
		require.Zero(t, code, "%v: %s", args, errOut)
		require.Equal(t, want.String()+"\n", out, "%v", args)
		require.Equal(t, 1, strings.Count(out, "\n"))
		for _, part := range []string{"wlproj " + want.Version, "commit=" + want.Revision, "dirty=", "go=" + runtime.Version(), "built="} {
			require.Contains(t, out, part, "%v", args)
		}
	}
}

func TestVersionJSON(t *testing.T) {
	t.Parallel()
	code, out, errOut := runCLI(t, "version", "--json")
	require.Zero(t, code, errOut)
	require.Equal(t, 1, strings.Count(out, "\n"), "one object on one line")
	var got map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	require.ElementsMatch(t, []string{"version", "revision", "dirty", "commit_time", "go_version", "build_date"}, keys(got))
	require.Equal(t, runtime.Version(), got["go_version"])
	require.IsType(t, false, got["dirty"])
	var info buildinfo.Info
	require.NoError(t, json.Unmarshal([]byte(out), &info))
	require.Equal(t, buildinfo.Get(), info)
}

func keys(m map[string]any) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// wlproj's CPU is the bench's replicas', the standby's too, found by pid:
// a process named wlproj that the bench did not start (another checkout's
// tests on a shared machine) is no one's.
func TestSampleCPUCountsTheBenchsReplicasAsWlproj(t *testing.T) {
	t.Parallel()
	sleep, err := exec.LookPath("sleep")
	require.NoError(t, err)
	body, err := os.ReadFile(sleep)
	require.NoError(t, err)
	fake := filepath.Join(t.TempDir(), "wlproj")
	require.NoError(t, os.WriteFile(fake, body, 0o755))
	start := func() int {
		cmd := exec.Command(fake, "30")
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd.Process.Pid
	}
	leader, standby, stranger := start(), start(), start()

	s := sampleCPU([]int{leader, standby})
	require.Equal(t, "wlproj", s[leader].role)
	require.Equal(t, "wlproj", s[standby].role)
	require.NotContains(t, s, stranger)
}

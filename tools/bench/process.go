package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// What the bench reads of a process besides its CPU seconds (cpu.go): a
// CPU profile of a replica, its peak memory, and CPU per event.

// profile saves a CPU profile of the replica taken over seconds.
func profile(ctx context.Context, r *harness.Replica, path string, seconds int) error {
	u := "http://127.0.0.1:" + strconv.Itoa(r.HTTPPort) + "/debug/pprof/profile?seconds=" + strconv.Itoa(seconds)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// peakRSS is VmHWM of a live process, in bytes.
func peakRSS(pid int) (int64, error) {
	status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	var kb int64
	for _, line := range strings.Split(string(status), "\n") {
		if _, err := fmt.Sscanf(line, "VmHWM: %d kB", &kb); err == nil {
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/%d/status", pid)
}

// perEvent is CPU seconds over events, in microseconds.
func perEvent(secs float64, events int) float64 {
	if events == 0 {
		return 0
	}
	return round1(secs * 1e6 / float64(events))
}

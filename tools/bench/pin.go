package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
)

// Pinning is where the pairs step ran its processes: the engine on one
// core, Postgres, the daemon and the bench on another, so that neither
// side of the end-to-end / raw ratio borrows the other's core.
type Pinning struct {
	EngineCPUs string `json:"engine_cpus"`
	RestCPUs   string `json:"rest_cpus"`
}

// pin moves the stack's engine (every thread) to core 0 and Postgres and
// this process to core 1; processes started after inherit it. It needs the
// stack's run directory (STACK_RUN_DIR, STACK_PG_DATA: `make bench` sets
// them) and two cores. unpin undoes it.
func pin() (*Pinning, func(), error) {
	if runtime.NumCPU() < 2 {
		return nil, nil, fmt.Errorf("-pin needs two cores, the machine has %d", runtime.NumCPU())
	}
	runDir, pgData := os.Getenv("STACK_RUN_DIR"), os.Getenv("STACK_PG_DATA")
	if runDir == "" || pgData == "" {
		return nil, nil, fmt.Errorf("-pin needs the local stack's STACK_RUN_DIR and STACK_PG_DATA (run it with `make bench`)")
	}
	engine, err := firstLineInt(filepath.Join(runDir, "es.pid"))
	if err != nil {
		return nil, nil, fmt.Errorf("-pin: the engine's pid: %w", err)
	}
	postmaster, err := firstLineInt(filepath.Join(pgData, "postmaster.pid"))
	if err != nil {
		return nil, nil, fmt.Errorf("-pin: the postmaster's pid: %w", err)
	}
	rest := append([]int{os.Getpid(), postmaster}, children(postmaster)...)
	all := fmt.Sprintf("0-%d", runtime.NumCPU()-1)
	unpin := func() {
		_ = taskset(all, engine)
		_ = taskset(all, append(rest, children(postmaster)...)...)
	}
	if err := taskset("0", engine); err != nil {
		return nil, nil, err
	}
	if err := taskset("1", rest...); err != nil {
		unpin()
		return nil, nil, err
	}
	return &Pinning{EngineCPUs: "0", RestCPUs: "1"}, unpin, nil
}

// taskset sets the CPU list of every thread of each pid; a process that
// exited meanwhile is skipped.
func taskset(cpus string, pids ...int) error {
	for _, pid := range pids {
		out, err := exec.Command("taskset", "-a", "-c", "-p", cpus, strconv.Itoa(pid)).CombinedOutput()
		if err != nil {
			if _, statErr := os.Stat(fmt.Sprintf("/proc/%d", pid)); statErr != nil {
				continue
			}
			return fmt.Errorf("taskset -c %s -p %d: %v: %s", cpus, pid, err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// children are the pids of pid's child processes.
func children(pid int) []int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		return nil
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			out = append(out, n)
		}
	}
	return out
}

func firstLineInt(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strconv.Atoi(strings.TrimSpace(line))
}

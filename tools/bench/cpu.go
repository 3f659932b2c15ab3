package main

import (
	"bytes"
	"context"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// clockTicks is USER_HZ, 100 on every Linux this runs on.
const clockTicks = 100

// cpuSample is the CPU time (user + system) used so far by each process
// (by pid) of a role on the machine: engine, postgres, wlproj (the
// replicas the bench runs: leader and standby alike) and bench (this
// process, which also runs the in-process loop of step 3).
type cpuSample map[int]roleCPU

type roleCPU struct {
	role string
	secs float64
}

// sampleCPU samples every process of a role; wlproj are the replicas' pids.
// A wlproj process the bench did not start (another checkout's tests on a
// shared machine) is no one's.
func sampleCPU(wlproj []int) cpuSample {
	s := cpuSample{}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return s
	}
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		open, end := bytes.IndexByte(stat, '('), bytes.LastIndexByte(stat, ')')
		if open < 0 || end < open {
			continue
		}
		comm := string(stat[open+1 : end])
		// After the command: state ppid pgrp session tty tpgid flags minflt
		// cminflt majflt cmajflt utime stime.
		fields := strings.Fields(string(stat[end+1:]))
		if len(fields) < 13 {
			continue
		}
		role := ""
		switch {
		case pid == self:
			role = "bench"
		case comm == "postgres":
			role = "postgres"
		case slices.Contains(wlproj, pid):
			role = "wlproj"
		case comm == "java":
			cmdline, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
			if bytes.Contains(cmdline, []byte("elasticsearch")) || bytes.Contains(cmdline, []byte("opensearch")) {
				role = "engine"
			}
		}
		if role == "" {
			continue
		}
		s[pid] = roleCPU{role, cpuSeconds(fields)}
	}
	return s
}

// sampleCPU samples every role, the bench's live replicas as wlproj: both
// of a pair, so that the standby's cost is wlproj's too.
func (b *bench) sampleCPU() cpuSample {
	pids := make([]int, 0, len(b.replicas))
	for _, r := range b.replicas {
		if r.Alive() {
			pids = append(pids, r.Pid())
		}
	}
	return sampleCPU(pids)
}

// loadAverage is the machine's one-minute load average, 0 if unknown.
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f, _, _ := strings.Cut(string(b), " ")
	v, _ := strconv.ParseFloat(f, 64)
	return v
}

// cpuSeconds is utime + stime of the fields of /proc/PID/stat after the
// command.
func cpuSeconds(fields []string) float64 {
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	return (utime + stime) / clockTicks
}

// dbCPUSample is the CPU time used so far by each Postgres backend (by pid)
// connected to the bench's database but the health sampler's: unlike the
// postgres role of cpuSample, it leaves out what other databases on a
// shared server cost.
type dbCPUSample map[int]float64

func (b *bench) sampleDBCPU(ctx context.Context) (dbCPUSample, error) {
	rows, err := b.pool.Query(ctx, `SELECT pid FROM pg_stat_activity
		 WHERE datname = current_database() AND application_name IS DISTINCT FROM $1`, healthApplication)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	s := dbCPUSample{}
	for rows.Next() {
		var pid int
		if err := rows.Scan(&pid); err != nil {
			return nil, err
		}
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			continue // a server on another machine, or gone
		}
		if end := bytes.LastIndexByte(stat, ')'); end > 0 {
			if fields := strings.Fields(string(stat[end+1:])); len(fields) >= 13 {
				s[pid] = cpuSeconds(fields)
			}
		}
	}
	return s, rows.Err()
}

// since is the CPU seconds the backends used between before and s; a
// backend that ended in between is missing, one that started counts whole.
func (s dbCPUSample) since(before dbCPUSample) float64 {
	var total float64
	for pid, v := range s {
		total += max(0, v-before[pid])
	}
	return harness.Round3(total)
}

// since is the CPU seconds each role used between before and s, process
// by process: one that exited in between is missing from s (the steps
// sample before they stop anything; a Postgres backend of other work on a
// shared server may end), one that started counts whole.
func (s cpuSample) since(before cpuSample) map[string]float64 {
	out := map[string]float64{}
	for pid, p := range s {
		if d := p.secs - before[pid].secs; d > 0 {
			out[p.role] += d
		}
	}
	for role, v := range out {
		out[role] = harness.Round3(v)
	}
	return out
}

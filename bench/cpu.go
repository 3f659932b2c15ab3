package main

import (
	"bytes"
	"os"
	"strconv"
	"strings"

	"github.com/wlproj/wlproj/internal/rig"
)

// clockTicks is USER_HZ, 100 on every Linux this runs on.
const clockTicks = 100

// cpuSample is the CPU time (user + system) used so far by the processes
// of each role on the machine: engine, postgres, wlproj (replicas) and bench
// (this process, which also runs the in-process loop of step 3).
type cpuSample map[string]float64

func sampleCPU() cpuSample {
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
		case comm == "wlproj":
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
		utime, _ := strconv.ParseFloat(fields[11], 64)
		stime, _ := strconv.ParseFloat(fields[12], 64)
		s[role] += (utime + stime) / clockTicks
	}
	return s
}

// since is the CPU seconds each role used between before and s. Processes
// that exited in between are missing from s: the steps sample before they
// stop anything.
func (s cpuSample) since(before cpuSample) map[string]float64 {
	out := map[string]float64{}
	for role, v := range s {
		if d := v - before[role]; d > 0 {
			out[role] = rig.Round3(d)
		}
	}
	return out
}

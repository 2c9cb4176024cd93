package controlplane_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// memory is what /proc/<pid>/status says of a process's memory, in bytes.
type memory struct {
	// RSS is the resident set now (VmRSS).
	RSS int64
	// Peak is the largest it has been (VmHWM).
	Peak int64
}

// readMemory reads a process's memory from /proc (Linux only).
func readMemory(pid int) (memory, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return memory{}, fmt.Errorf("read memory of process %d: %w", pid, err)
	}
	var m memory
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		key, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		var dst *int64
		switch key {
		case "VmRSS":
			dst = &m.RSS
		case "VmHWM":
			dst = &m.Peak
		default:
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			return memory{}, fmt.Errorf("parse %s of process %d: %w", key, pid, err)
		}
		*dst = kb << 10
	}
	if m.RSS == 0 {
		return memory{}, fmt.Errorf("no VmRSS for process %d", pid)
	}
	return m, nil
}

// cpuTicks is the CPU time a process has used, user and system, in clock
// ticks (1/100 s on Linux): fields 14 and 15 of /proc/<pid>/stat.
func cpuTicks(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("read CPU time of process %d: %w", pid, err)
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	end := bytes.LastIndexByte(b, ')')
	if end < 0 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	fields := strings.Fields(string(b[end+1:])) // from field 3 on
	if len(fields) < 13 {
		return 0, fmt.Errorf("parse /proc/%d/stat: %d fields", pid, len(fields))
	}
	var sum int64
	for _, f := range fields[11:13] {
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parse /proc/%d/stat: %w", pid, err)
		}
		sum += v
	}
	return sum, nil
}

// Idleness: a process is at rest when it used at most idleTicks of CPU
// in an idleWindow.
const (
	idleWindow = time.Second
	idleTicks  = 3
)

// waitIdle waits until every process is at rest in the same window, so
// that a measurement starts with no push or resync still running, and
// returns how long that took.
func waitIdle(ctx context.Context, timeout time.Duration, pids ...int) (time.Duration, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	before := make([]int64, len(pids))
	for {
		for i, pid := range pids {
			t, err := cpuTicks(pid)
			if err != nil {
				return 0, err
			}
			before[i] = t
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("wait for processes %v to be idle: %w", pids, ctx.Err())
		case <-time.After(idleWindow):
		}
		idle := true
		for i, pid := range pids {
			t, err := cpuTicks(pid)
			if err != nil {
				return 0, err
			}
			if t-before[i] > idleTicks {
				idle = false
			}
		}
		if idle {
			return time.Since(start), nil
		}
	}
}

// gauge scrapes a Prometheus text endpoint and returns the sum of the
// series of one metric.
func gauge(ctx context.Context, url, metric string) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("scrape %s: %s", url, resp.Status)
	}
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, metric)
		if !ok || rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		if rest[0] == '{' {
			rest = rest[strings.LastIndexByte(rest, '}')+1:]
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return 0, fmt.Errorf("parse %s: %w", line, err)
		}
		sum += v
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("read %s: %w", url, err)
	}
	return sum, nil // 0 for a gauge with no series yet
}

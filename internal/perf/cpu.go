package perf

import (
	"math"
	"time"
)

// A clock reads the wall time and the process's CPU time (user + system, every thread)
// at the start of a measured interval.
type clock struct {
	wall     time.Time
	cpu, sys time.Duration
	ok       bool
}

func startClock() clock {
	cpu, sys, ok := ProcessCPU()
	return clock{wall: time.Now(), cpu: cpu, sys: sys, ok: ok}
}

func (k clock) elapsed() time.Duration { return time.Since(k.wall) }

// account fills r's CPU figures for the interval since k: the process's CPU time, per GiB
// of payload moved and per data packet (messages of c.Size bytes cut at c.MTU). In a
// loopback run the process holds both sides, so the figures are both sides' together.
func (k clock) account(c *Config, r *Result) {
	cpu, sys, ok := ProcessCPU()
	if !ok || !k.ok || r.Iters == 0 {
		return
	}
	s := (cpu - k.cpu).Seconds()
	r.CPUSeconds, r.SysSeconds = s, (sys - k.sys).Seconds()
	r.CPUPerGiB = s / (float64(c.Size) * float64(r.Iters) / (1 << 30))
	pkts := float64(r.Iters) * math.Max(1, math.Ceil(float64(c.Size)/float64(c.MTU)))
	r.CPUPerPacket = s / pkts * 1e6
}

//go:build linux

package rxevm

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Counters are rxe0 port 1's hardware counters by name (sent_pkts, rcvd_pkts,
// duplicate_request, out_of_seq_request, rcvd_seq_err, completer_retry_err, ...): the same
// numbers as 'rdma statistic show link rxe0/1'.
type Counters map[string]uint64

// Counters reads the guest's rxe counters from
// /sys/class/infiniband/rxe0/ports/1/hw_counters. They count from the VM's boot; take
// the difference of two readings (Sub) for one run.
func (v *VM) Counters(ctx context.Context) (Counters, error) {
	out, stderr, rc, err := v.Exec(ctx, "cd /sys/class/infiniband/"+rxeDev+"/ports/1/hw_counters && grep -H . -- *")
	if err != nil {
		return nil, err
	}
	if rc != 0 {
		return nil, fmt.Errorf("rxevm: reading rxe counters: exit code %d: %s", rc, strings.TrimSpace(stderr))
	}
	return parseCounters(out)
}

// parseCounters reads "name:value" lines (grep -H's output).
func parseCounters(s string) (Counters, error) {
	c := make(Counters)
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		if line == "" {
			continue
		}
		name, val, ok := strings.Cut(line, ":")
		if !ok {
			return nil, fmt.Errorf("rxevm: bad counter line %q", line)
		}
		n, err := strconv.ParseUint(strings.TrimSpace(val), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("rxevm: bad counter line %q: %v", line, err)
		}
		c[name] = n
	}
	if len(c) == 0 {
		return nil, fmt.Errorf("rxevm: no rxe counters")
	}
	return c, nil
}

// Sub returns c - before, counter by counter (counters missing from before count from 0).
func (c Counters) Sub(before Counters) Counters {
	d := make(Counters, len(c))
	for k, v := range c {
		d[k] = v - before[k]
	}
	return d
}

// String lists the counters by name, those that are zero left out ("{}" if all are).
func (c Counters) String() string {
	names := make([]string, 0, len(c))
	for k, v := range c {
		if v != 0 {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteByte('{')
	for i, k := range names {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%d", k, c[k])
	}
	b.WriteByte('}')
	return b.String()
}

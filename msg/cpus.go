package msg

import (
	"os"
	"strconv"
	"strings"
)

// cpuShare is how many CPUs (GOMAXPROCS) a rank takes, or 0 to leave GOMAXPROCS as it
// is. usable is the CPUs the process may run on (runtime.NumCPU: its affinity mask),
// online the host's (0: unknown), local the ranks on this host and cpus the launcher's
// CPUs per rank (0: unknown for either).
func cpuShare(usable, online, local, cpus int) int {
	switch {
	case online > 0 && usable < online:
		return 0 // bound by the launcher (or taskset) to its share already
	case cpus > 0:
		return min(cpus, usable)
	case local > 1:
		return max(1, usable/local)
	}
	return 0
}

// onlineCPUs is the number of CPUs the host has online (Linux's
// /sys/devices/system/cpu/online, "0-7" or "0,2-5"), or 0 where that cannot be read.
func onlineCPUs() int {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		return 0
	}
	n := 0
	for _, r := range strings.Split(strings.TrimSpace(string(b)), ",") {
		lo, hi, isRange := strings.Cut(r, "-")
		a, err1 := strconv.Atoi(lo)
		z, err2 := a, error(nil)
		if isRange {
			z, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil || z < a {
			return 0
		}
		n += z - a + 1
	}
	return n
}

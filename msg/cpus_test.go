package msg

import (
	"runtime"
	"testing"
)

func TestCPUShare(t *testing.T) {
	for _, c := range []struct {
		usable, online, local, cpus, want int
	}{
		{8, 8, 0, 0, 0}, // nothing said: leave GOMAXPROCS
		{8, 8, 1, 0, 0}, // alone on the host
		{8, 8, 4, 0, 2}, // srun -n 4 on an 8-CPU node
		{2, 2, 4, 0, 1}, // more ranks than CPUs: at least one
		{8, 8, 2, 3, 3}, // srun -c 3
		{2, 2, 1, 4, 2}, // srun -c 4 on a 2-CPU node (overcommitted): what there is
		{2, 8, 4, 0, 0}, // bound to 2 of the 8 CPUs: that is its share already
		{2, 8, 2, 2, 0}, // bound, and -c says the same
		{8, 0, 4, 0, 2}, // online unknown (not Linux): the share
	} {
		if got := cpuShare(c.usable, c.online, c.local, c.cpus); got != c.want {
			t.Errorf("cpuShare(usable %d, online %d, local %d, cpus %d) = %d, want %d", c.usable, c.online, c.local, c.cpus, got, c.want)
		}
	}
}

func TestOnlineCPUs(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads Linux's sysfs")
	}
	if n := onlineCPUs(); n < runtime.NumCPU() {
		t.Errorf("onlineCPUs() = %d, fewer than NumCPU %d", n, runtime.NumCPU())
	}
}

package perf

import (
	"net"
	"os"
	"runtime"
	"sync"
)

// shareHost gives this process half of the host's CPUs (GOMAXPROCS) when the peer at
// addr runs on the same host (a loopback address or one of the host's own), unless the
// GOMAXPROCS environment variable is set, and returns a function that puts the old value
// back. Client and server each poll on every processor they have: two processes doing
// so on one host take each other's CPUs, and their goroutines wait behind the other's
// busy-polling threads (two-process send_lat p99 150-180 us with both at 2 on 2 CPUs,
// 55-85 us at 1). The messaging layer's ranks share a host the same way (msg
// Config.LocalSize).
func shareHost(addr net.Addr) (restore func()) {
	if os.Getenv("GOMAXPROCS") != "" || !sameHost(addr) {
		return func() {}
	}
	shared.Lock()
	defer shared.Unlock()
	if shared.users == 0 { // the first of client and server in this process (tests run both)
		shared.old = runtime.GOMAXPROCS(max(1, runtime.NumCPU()/2))
	}
	shared.users++
	return func() {
		shared.Lock()
		defer shared.Unlock()
		if shared.users--; shared.users == 0 {
			runtime.GOMAXPROCS(shared.old)
		}
	}
}

// shared counts the runs sharing the host's CPUs, and what GOMAXPROCS was before them.
var shared struct {
	sync.Mutex
	users, old int
}

// sameHost reports whether addr is a loopback address or one of this host's.
func sameHost(addr net.Addr) bool {
	ta, ok := addr.(*net.TCPAddr)
	if !ok {
		return false
	}
	if ta.IP.IsLoopback() {
		return true
	}
	own, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, a := range own {
		if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ta.IP) {
			return true
		}
	}
	return false
}

//go:build linux

package interop

import (
	"testing"
	"time"
)

// TestRiostream: librdmacm's riostream (rsockets' direct writes over rxe) against
// softrnic's cmd/riostream, both ways: each side's iomap entry for its transfer buffer
// (an RDMA WRITE WITH IMMEDIATE into the peer's iomap table, after its two grant slots),
// the 16-byte sync in the stream, then plain RDMA WRITEs into the peer's buffer, each
// iteration's last carrying the marker the peer polls for. With -T v both tools check
// the bytes before every marker (riostream's verify_buf: the pattern runs on across the
// run); the intermediate writes carry whatever the buffer holds, which neither checks.
// The C tool exits non-zero on a failed check or call, and prints its table's line
// only for a test that ran.
func TestRiostream(t *testing.T) {
	vm := sharedVM(t)
	bin := tool(t, "cmd/riostream")
	for _, c := range []cell{
		{name: "guest-server/64x10x100", guestServer: true, guest: "riostream -b $GUEST -S 64 -C 10 -I 100 -T v", guestReady: cmListening,
			host: []string{bin, "-s", "$GUEST", "-S", "64", "-C", "10", "-I", "100", "-T", "v", "--json", "--timeout", "2m"}},
		{name: "host-server/64x10x100", guest: "riostream -s $HOST -S 64 -C 10 -I 100 -T v", hostReady: "usec/xfer",
			host: []string{bin, "-b", "$HOST", "-S", "64", "-C", "10", "-I", "100", "-T", "v", "--json", "--timeout", "2m"}},
		{name: "guest-server/64Kx100x3", guestServer: true, guest: "riostream -b $GUEST -S 65536 -C 100 -I 3 -T v", guestReady: cmListening,
			host: []string{bin, "-s", "$GUEST", "-S", "65536", "-C", "100", "-I", "3", "-T", "v", "--json", "--timeout", "2m"}},
		{name: "host-server/64Kx100x3", guest: "riostream -s $HOST -S 65536 -C 100 -I 3 -T v", hostReady: "usec/xfer",
			host: []string{bin, "-b", "$HOST", "-S", "65536", "-C", "100", "-I", "3", "-T", "v", "--json", "--timeout", "2m"}},
		{name: "guest-server/1Mx10", guestServer: true, guest: "riostream -b $GUEST -S 1048576 -C 10 -T v", guestReady: cmListening,
			host: []string{bin, "-s", "$GUEST", "-S", "1048576", "-C", "10", "-T", "v", "--json", "--timeout", "2m"}},
		{name: "host-server/1Mx10", guest: "riostream -s $HOST -S 1048576 -C 10 -T v", hostReady: "usec/xfer",
			host: []string{bin, "-b", "$HOST", "-S", "1048576", "-C", "10", "-T", "v", "--json", "--timeout", "2m"}},
	} {
		c.tool, c.mode = "riostream", "rsocket, direct writes; "+modeOf(c.guest)
		c.guestWant = []string{"custom "}
		c.hostWant = []string{`"tool":"riostream"`, `"test":"custom"`, `"checked":true`}
		c.timeout = 3 * time.Minute
		t.Run(c.name, func(t *testing.T) { c.run(t, vm) })
	}
}

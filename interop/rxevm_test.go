//go:build linux

package interop

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/interop/rxevm"
)

// The VM's rxe0 is up as the driver says: PORT_ACTIVE, GID index 1 = ::ffff:10.77.1.2 of
// type RoCE v2, active_mtu 1024 on a 1500-byte link.
func TestRxeReady(t *testing.T) {
	vm := sharedVM(t)
	shared.mu.Lock()
	for _, l := range shared.log {
		t.Log(l)
	}
	shared.mu.Unlock()
	in := vm.Info()
	t.Logf("%+v", in)
	if in.GIDIndex != 1 {
		t.Errorf("GID index %d, want 1", in.GIDIndex)
	}
	if want := netip.MustParseAddr("::ffff:10.77.1.2"); in.GuestGID != want {
		t.Errorf("guest GID %v, want %v", in.GuestGID, want)
	}
	if in.ActiveMTU != 1024 {
		t.Errorf("active_mtu %d on a %d-byte link, want 1024", in.ActiveMTU, in.MTU)
	}
	out := execOK(t, vm, time.Minute, `P=/sys/class/infiniband/rxe0/ports/1
cat $P/state $P/gids/$SOFTRNIC_GID_INDEX $P/gid_attrs/types/$SOFTRNIC_GID_INDEX $P/gid_attrs/ndevs/$SOFTRNIC_GID_INDEX
ibv_devinfo -d rxe0 | grep -E 'state:|active_mtu:|link_layer:'`)
	t.Logf("guest:\n%s", out)
	for _, want := range []string{
		"4: ACTIVE\n",
		"0000:0000:0000:0000:0000:ffff:0a4d:0102\n", // ::ffff:10.77.1.2
		"RoCE v2\n",
		"eth0\n",
		"PORT_ACTIVE",
		"1024 (3)",
		"Ethernet",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("guest output lacks %q", want)
		}
	}
}

// Exec returns a command's stdout, stderr and exit code; the environment names the GID
// index and the addresses. Logs the round trip of a trivial command.
func TestExec(t *testing.T) {
	vm := sharedVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, stderr, rc, err := vm.Exec(ctx, `echo "out $SOFTRNIC_GID_INDEX $GUEST_IP $HOST_IP"; echo err >&2; exit 3`)
	if err != nil {
		t.Fatal(err)
	}
	if out != "out 1 10.77.1.2 10.77.1.1\n" || stderr != "err\n" || rc != 3 {
		t.Errorf("got stdout %q stderr %q rc %d; want %q %q 3", out, stderr, rc, "out 1 10.77.1.2 10.77.1.1\n", "err\n")
	}
	const n = 5
	t0 := time.Now()
	for range n {
		if _, _, rc, err := vm.Exec(ctx, "true"); err != nil || rc != 0 {
			t.Fatalf("true: rc %d, err %v", rc, err)
		}
	}
	t.Logf("Exec round trip of 'true': %v (mean of %d)", (time.Since(t0) / n).Round(time.Millisecond), n)
}

// A command still running when its context ends is killed, with its process group, and
// Exec returns soon after with the context's error and the output so far.
func TestExecDeadline(t *testing.T) {
	vm := sharedVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	t0 := time.Now()
	out, _, rc, err := vm.Exec(ctx, "echo started; sleep 600 & sleep 601; echo not reached")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v, want DeadlineExceeded", err)
	}
	if d := time.Since(t0); d > 20*time.Second {
		t.Errorf("Exec returned %v after its deadline", d-3*time.Second)
	}
	if out != "started\n" || rc != 143 {
		t.Errorf("stdout %q rc %d, want %q 143 (SIGTERM)", out, rc, "started\n")
	}
	// both sleeps were in the job's process group: none is left
	ps := "grep -las '^sleep.60[01]' /proc/[0-9]*/cmdline | wc -l"
	if left := execOK(t, vm, time.Minute, ps); strings.TrimSpace(left) != "0" {
		t.Errorf("%s sleep processes left after the kill", strings.TrimSpace(left))
	}
}

// Spawn runs a command in the background while others run: a guest "server" waits on a
// FIFO until an Exec writes to it; Wait returns its output. Signal stops a job.
func TestSpawnWait(t *testing.T) {
	vm := sharedVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	execOK(t, vm, time.Minute, "rm -f /tmp/spawn.fifo && mkfifo /tmp/spawn.fifo")
	j, err := vm.Spawn("read line </tmp/spawn.fifo && echo \"got $line\"")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-j.Done():
		t.Fatal("the job ended before anything was written to its FIFO")
	default:
	}
	execOK(t, vm, time.Minute, "echo hello >/tmp/spawn.fifo")
	out, stderr, rc, err := j.Wait(ctx)
	if err != nil || rc != 0 || out != "got hello\n" {
		t.Fatalf("job: stdout %q stderr %q rc %d err %v; want \"got hello\\n\" rc 0", out, stderr, rc, err)
	}

	j, err = vm.Spawn("echo up; exec sleep 600")
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Signal("INT"); err != nil {
		t.Fatal(err)
	}
	if _, _, rc, err := j.Wait(ctx); err != nil || rc != 130 {
		t.Errorf("after SIGINT: rc %d err %v, want 130", rc, err)
	}
}

// A host program runs in the namespace: it sees the bridge with 10.77.1.1 and reaches the
// guest, the guest reaches the host (static ARP both ways), and so does a socket made in
// InNamespace, as a capture on the bridge shows.
func TestHostCommand(t *testing.T) {
	vm := sharedVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := vm.HostCommand(ctx, "ip", "-br", "addr").CombinedOutput()
	if err != nil {
		t.Fatalf("ip -br addr: %v: %s", err, out)
	}
	t.Logf("in the namespace:\n%s", out)
	if !strings.Contains(string(out), "br0") || !strings.Contains(string(out), "10.77.1.1/24") {
		t.Errorf("no br0 with 10.77.1.1/24 in the namespace")
	}

	// A socket made in InNamespace belongs to the namespace: it binds 10.77.1.1 (the host
	// has no such address outside) and is used afterwards from this goroutine.
	var conn *net.UDPConn
	err = vm.InNamespace(func() (err error) {
		conn, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(vm.Info().HostAddr, 0)))
		return err
	})
	if err != nil {
		t.Fatalf("InNamespace: %v", err)
	}
	defer conn.Close()

	pcap := filepath.Join(t.TempDir(), "ping.pcap")
	c, err := vm.Capture(ctx, pcap, "icmp[icmptype] == icmp-echo or icmp[icmptype] == icmp-echoreply or udp port 9999")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := vm.HostCommand(ctx, "busybox", "ping", "-c", "1", "-W", "20", "10.77.1.2").CombinedOutput(); err != nil {
		t.Errorf("host → guest ping: %v: %s", err, out)
	}
	execOK(t, vm, time.Minute, "busybox ping -c 1 -W 20 10.77.1.1")
	if _, err := conn.WriteToUDPAddrPort([]byte("hello"), netip.AddrPortFrom(vm.Info().GuestAddr, 9999)); err != nil {
		t.Errorf("UDP from the InNamespace socket: %v", err)
	}
	n, err := c.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if n != 5 {
		t.Errorf("captured %d packets, want 5 (two echo requests, two replies, one UDP datagram)", n)
	}
	if fi, err := os.Stat(pcap); err != nil || fi.Size() == 0 {
		t.Errorf("pcap %s: %v", pcap, err)
	}
}

// Files a test writes into the VM's shared dir, and a Go binary it builds there, are
// visible in the guest at once, at the same path, also after a change. A new file in
// t.TempDir() is visible too (through the guest's view of the host's root).
func TestSharedDir(t *testing.T) {
	vm := sharedVM(t)
	tmp := filepath.Join(t.TempDir(), "new")
	if err := os.WriteFile(tmp, []byte("fresh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := execOK(t, vm, time.Minute, "cat "+tmp); got != "fresh\n" {
		t.Errorf("guest reads %q from %s", got, tmp)
	}
	dir, err := vm.MkdirTemp("shared-")
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(dir, "x")
	for _, s := range []string{"one", "two"} {
		if err := os.WriteFile(f, []byte(s+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := execOK(t, vm, time.Minute, "cat "+f); got != s+"\n" {
			t.Errorf("guest reads %q, host wrote %q", got, s)
		}
	}
	bin := filepath.Join(dir, "guesthello")
	build := exec.Command("go", "build", "-o", bin, "./testdata/guesthello")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v: %s", err, out)
	}
	if got, want := execOK(t, vm, time.Minute, bin+" a b"), "hello from "+vm.Info().Name+", args [\"a\" \"b\"]\n"; got != want {
		t.Errorf("guest ran %s: %q, want %q", bin, got, want)
	}
}

// rxe works in the guest (ibv_rc_pingpong over rxe0 to its own address: loopback inside
// rxe), and its counters count it. Also the pattern for a guest server: Spawn, wait for
// it to listen, run the client, Wait for the server with a deadline.
func TestCounters(t *testing.T) {
	vm := sharedVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	before, err := vm.Counters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"sent_pkts", "rcvd_pkts", "duplicate_request", "out_of_seq_request", "completer_retry_err"} {
		if _, ok := before[name]; !ok {
			t.Errorf("no counter %s in %v", name, before)
		}
	}
	srv, err := vm.Spawn("ibv_rc_pingpong -d rxe0 -g $SOFTRNIC_GID_INDEX -n 10 -s 1024")
	if err != nil {
		t.Fatal(err)
	}
	if err := vm.WaitUntil(ctx, "ss -Hltn 'sport = :18515' | grep -q ."); err != nil {
		t.Fatal(err)
	}
	cli := execOK(t, vm, time.Minute, "ibv_rc_pingpong -d rxe0 -g $SOFTRNIC_GID_INDEX -n 10 -s 1024 $GUEST_IP")
	out, stderr, rc, err := srv.Wait(ctx)
	if err != nil || rc != 0 {
		t.Fatalf("server: rc %d err %v\n%s%s", rc, err, out, stderr)
	}
	t.Logf("client: %s", strings.TrimSpace(cli))
	after, err := vm.Counters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d := after.Sub(before)
	t.Logf("counter deltas: %v", d)
	// 10 iterations of 1024-byte sends both ways plus ACKs, seen from both ends
	if d["sent_pkts"] < 40 || d["rcvd_pkts"] < 40 {
		t.Errorf("sent_pkts +%d, rcvd_pkts +%d; want at least 40 each", d["sent_pkts"], d["rcvd_pkts"])
	}
}

// A 9000-byte link gives rxe an active MTU of 4096 (a VM of its own).
func TestJumboMTU(t *testing.T) {
	vm := ownVM(t, rxevm.Config{Name: vmName("9000"), MTU: 9000})
	in := vm.Info()
	t.Logf("booted in %v", in.BootTime.Round(time.Millisecond))
	if in.ActiveMTU != 4096 {
		t.Errorf("active_mtu %d on a 9000-byte link, want 4096", in.ActiveMTU)
	}
	out := execOK(t, vm, time.Minute, "cat /sys/class/net/eth0/mtu; ibv_devinfo -d rxe0 | grep active_mtu")
	if !strings.HasPrefix(out, "9000\n") || !strings.Contains(out, "4096 (5)") {
		t.Errorf("guest: %s", out)
	}
	mtu, err := vm.HostCommand(context.Background(), "cat", "/sys/class/net/br0/mtu").Output()
	if err != nil || string(mtu) != "9000\n" {
		t.Errorf("bridge MTU %q, err %v; want 9000", mtu, err)
	}
	checkDeviceMTU(t, vm)
}

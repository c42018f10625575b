//go:build linux

package interop

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/softrnic/softrnic/interop/rxevm"
)

// A cell of the matrix: one C tool on the guest's rxe0 against softrnic's counterpart on
// the host, in one direction. The server starts first and the client once the server
// listens; both must exit 0 and print what the C tool prints on success; every packet on
// the bridge must carry a valid ICRC and go to UDP 4791; neither side may count errors
// the other's packets caused.
type cell struct {
	name string
	// tool is the C tool and mode the cell's variant, for the matrix.
	tool, mode  string
	guestServer bool
	guest       string   // the guest's command line ($GUEST and $HOST are the addresses)
	host        []string // softrnic's tool and its arguments (the same placeholders)
	// guestReady is a guest shell condition that holds once the guest server listens;
	// hostReady a line the host server prints (stdout or stderr) once it listens.
	guestReady, hostReady string
	// guestWant and hostWant must appear in each side's output.
	guestWant, hostWant []string
	timeout             time.Duration
	// lossy: the link drops and reorders packets (TestLossyLink), so rxe's sequence
	// error counters count what the link did; they are logged, not checked.
	lossy bool
}

// lastACKLost recognises the ways ibv_rc_pingpong fails on a lossy link that are no
// fault of either side: it has no closing handshake, so a side that has everything exits,
// and if the link lost the ACK of the other side's last SEND, that side retransmits to a
// QP that no longer exists. The server's last SEND (the client exits once it has it and
// its own sends are acknowledged): the server ends with "transport retry counter
// exceeded" on its last send (wr_id 2), having received everything. The client's last
// SEND (the server exits once it was received and its own replies acknowledged): an rxe
// client never ends, as rxe takes the retry count 7 ibv_rc_pingpong asks for as "for ever"
// (guestStuck: stopped a minute after softrnic's server ended, having received every
// reply). It returns the side that failed so ("guest" or "host"), or "" if the cell did
// not end that way.
func (c *cell) lastACKLost(guestRC int, guestStuck bool, guestOut string, hostErr error, hostOut string, rxe map[string]uint64) string {
	if !c.lossy || c.tool != "ibv_rc_pingpong" {
		return ""
	}
	n := 0
	if f := strings.Fields(c.guest); slices.Contains(f, "-n") && slices.Index(f, "-n")+1 < len(f) {
		n, _ = strconv.Atoi(f[slices.Index(f, "-n")+1])
	}
	iters := fmt.Sprintf("%d iters in", n)
	switch {
	case c.guestServer && guestRC != 0 && hostErr == nil && strings.Contains(hostOut, `"checked":true`) &&
		strings.Contains(guestOut, "transport retry counter exceeded (12) for wr_id 2") && rxe["rdma_recvs"] == uint64(n):
		return "guest"
	case !c.guestServer && guestStuck && hostErr == nil && strings.Contains(hostOut, `"checked":true`) &&
		strings.Contains(hostOut, fmt.Sprintf(`"iters":%d,`, n)) && rxe["rdma_recvs"] == uint64(n):
		return "guest"
	case !c.guestServer && guestRC == 0 && strings.Contains(guestOut, iters) && hostErr != nil &&
		strings.Contains(hostOut, "transport retry counter exceeded (12) for wr_id 2 (") &&
		strings.Contains(hostOut, fmt.Sprintf(") after %d of %d iterations (received %d, sent %d)", n-1, n, n, n-1)):
		return "host"
	}
	return ""
}

// rdma_cm listeners show in the guest's resource table.
const cmListening = "rdma res show cm_id | grep -q LISTEN"

// tcpListening is the condition for a guest tool's TCP exchange port.
func tcpListening(port int) string { return fmt.Sprintf("ss -Hltn 'sport = :%d' | grep -q .", port) }

// tool builds softrnic's command pkg (e.g. "cmd/rping") for the test, which runs it on the
// host, in the VM's namespace.
func tool(t *testing.T, pkg string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), filepath.Base(pkg))
	out, err := exec.Command("go", "build", "-o", bin, "github.com/softrnic/softrnic/"+pkg).CombinedOutput()
	if err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// modeOf is what distinguishes a cell for the matrix: the guest command's options
// without its device, GID index and addresses.
func modeOf(guest string) string {
	var keep []string
	f := strings.Fields(guest)
	for i := 1; i < len(f); i++ {
		switch {
		case f[i] == "-d" || f[i] == "-x" || f[i] == "-g" || f[i] == "-a" || f[i] == "-b" || (f[i] == "-s" && i+1 < len(f) && strings.HasPrefix(f[i+1], "$")):
			i++
		case strings.HasPrefix(f[i], "$"):
		default:
			keep = append(keep, f[i])
		}
	}
	return strings.Join(keep, " ")
}

func expand(s string, in rxevm.Info) string {
	return strings.NewReplacer("$GUEST", in.GuestAddr.String(), "$HOST", in.HostAddr.String()).Replace(s)
}

// run runs the cell on vm.
func (c cell) run(t *testing.T, vm *rxevm.VM) {
	record(t, c.tool, c.guestServer, c.mode)
	in := vm.Info()
	timeout := c.timeout
	if timeout == 0 {
		timeout = 3 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	guestCmd := expand(c.guest, in)
	hostArgs := make([]string, len(c.host))
	for i, a := range c.host {
		hostArgs[i] = expand(a, in)
	}
	before, err := vm.Counters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	capPath := filepath.Join(t.TempDir(), "cell.pcap")
	stopCapture, err := ppCapture(ctx, vm, capPath)
	if err != nil {
		t.Fatal(err)
	}

	var hostOut lockedBuffer
	var guestOut, guestErr string
	var guestRC int
	var hostErr error
	guestStuck := false // a guest client stopped a minute after softrnic's server ended
	host := vm.HostCommand(ctx, hostArgs[0], hostArgs[1:]...)
	if c.guestServer {
		srv, err := vm.Spawn(guestCmd)
		if err != nil {
			t.Fatal(err)
		}
		if err := vm.WaitUntil(ctx, c.guestReady); err != nil {
			_ = srv.Signal("TERM")
			t.Fatalf("guest server not listening: %v", err)
		}
		host.Stdout, host.Stderr = &hostOut, &hostOut
		hostErr = host.Run()
		if hostErr != nil {
			_ = srv.Signal("TERM")
		}
		// Once the client has ended, the server has at most its retry budget left.
		wctx, wcancel := context.WithTimeout(ctx, time.Minute)
		guestOut, guestErr, guestRC, err = srv.Wait(wctx)
		wcancel()
		if err != nil {
			t.Errorf("guest server: %v", err)
		}
	} else {
		pr, pw := io.Pipe()
		host.Stdout, host.Stderr = pw, pw
		if err := host.Start(); err != nil {
			t.Fatal(err)
		}
		ready := make(chan struct{})
		copied := make(chan struct{})
		go func() {
			defer close(copied)
			sc := bufio.NewScanner(pr)
			seen := false
			for sc.Scan() {
				hostOut.WriteString(sc.Text() + "\n")
				if !seen && strings.Contains(sc.Text(), c.hostReady) {
					seen = true
					close(ready)
				}
			}
			if !seen {
				close(ready)
			}
		}()
		<-ready
		job, err := vm.Spawn(guestCmd)
		if err != nil {
			_ = host.Process.Kill()
			t.Fatal(err)
		}
		hostDone := make(chan struct{})
		go func() { hostErr = host.Wait(); close(hostDone) }()
		// Once softrnic's server has ended, the guest's client has at most its retry
		// budget left: it gets a minute, then it is stopped (guestStuck).
		gctx, gcancel := context.WithCancel(ctx)
		stuck := make(chan struct{})
		go func() {
			select {
			case <-hostDone:
			case <-gctx.Done():
				return
			}
			select {
			case <-time.After(time.Minute):
				close(stuck)
				gcancel()
			case <-gctx.Done():
			}
		}()
		guestOut, guestErr, guestRC, err = job.Wait(gctx)
		gcancel()
		select {
		case <-stuck:
			guestStuck = true
		default:
		}
		if err != nil && !guestStuck {
			t.Errorf("guest client: %v", err)
		}
		if guestRC != 0 && !guestStuck {
			_ = host.Process.Kill()
		}
		<-hostDone
		pw.Close()
		<-copied
	}
	capErr := stopCapture()
	// A fresh context: the cell's may have ended, and what follows says why.
	ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	after, err := vm.Counters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rxe := after.Sub(before)
	t.Logf("guest: %s (exit %d)\n%s%s", guestCmd, guestRC, guestOut, guestErr)
	t.Logf("host: %s\n%s", strings.Join(hostArgs, " "), hostOut.String())
	t.Logf("rxe counters: %v", rxe)

	guestWant, hostWant := c.guestWant, c.hostWant
	if side := c.lastACKLost(guestRC, guestStuck, guestOut+guestErr, hostErr, hostOut.String(), rxe); side != "" {
		// Not a failure of either side: the tool cannot know, and nor could two rxe peers.
		t.Logf("the %s sent the last message, which its peer received and acknowledged; the link lost the ACK and the peer had exited by the retransmissions", side)
		if guestStuck {
			// rxe takes the retry count 7 that ibv_rc_pingpong asks for as "for ever"
			// (rxe_comp.c decrements it only below 7): its client resends to a closed port
			// until it is stopped, where the IBTA's count would end it after 7 tries.
			t.Logf("rxe's client retried without end (completer_retry_err %d); it was stopped a minute after softrnic's server ended", rxe["completer_retry_err"])
		}
		if side == "guest" {
			guestRC, guestWant, rxe["retry_exceeded_err"] = 0, nil, 0
		} else {
			hostErr, hostWant = nil, nil
		}
	}
	if guestRC != 0 {
		t.Errorf("guest tool exited %d", guestRC)
	}
	if hostErr != nil {
		t.Errorf("softrnic's tool: %v", hostErr)
	}
	for _, w := range guestWant {
		if !strings.Contains(guestOut+guestErr, expand(w, in)) {
			t.Errorf("guest output lacks %q", w)
		}
	}
	for _, w := range hostWant {
		if !strings.Contains(hostOut.String(), expand(w, in)) {
			t.Errorf("softrnic's output lacks %q", w)
		}
	}
	if strings.Contains(hostOut.String(), `"errors":`) && !c.lossy {
		// The librdmacm tools' --json: ICRC, malformed, unknown QP, wrong source, CM
		// drops. On a lossy link a late duplicate MAD is a CM drop the link caused.
		t.Error("softrnic's tool counted errors the peer's packets caused")
	}
	checkRxe(t, rxe, c.lossy)
	var drop *captureDropError
	if errors.As(capErr, &drop) {
		t.Logf("capture incomplete (the checks below cover what it holds): %v", capErr)
	} else if capErr != nil {
		t.Fatalf("capture: %v", capErr)
	}
	r, err := CheckCapture(capPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("bridge: %v", r)
	if err := r.Err(); err != nil {
		t.Error(err)
	}
	if r.Packets == 0 {
		t.Error("no RoCEv2 packet on the bridge")
	}
}

// lockedBuffer is a bytes.Buffer written by one goroutine and read by another.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) WriteString(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.WriteString(s)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestRping: librdmacm's rping on rxe against softrnic's cmd/rping, both ways: the
// connection through rdma_cm (Linux's Starting-PSN convention, MADs to 4791), RDMA READ
// and WRITE of the advertised buffers, and the data validated (-V) where rping checks it.
func TestRping(t *testing.T) {
	sharedVM(t) // skips the whole test where the VM cannot run
	bin := tool(t, "cmd/rping")
	for _, c := range []cell{
		{name: "guest-server", guestServer: true, guest: "rping -s -a $GUEST -v -V -C 10", guestReady: cmListening,
			host: []string{bin, "-c", "-a", "$GUEST", "-v", "-V", "-C", "10", "--json"}, hostWant: []string{`"ok":true`, "ping data: rdma-ping-9: "}},
		{name: "host-server", guest: "rping -c -a $HOST -v -V -C 10", hostReady: "rping: listening on",
			host: []string{bin, "-s", "-a", "$HOST", "-v", "-V", "--json"}, guestWant: []string{"ping data: rdma-ping-9: "}, hostWant: []string{`"ok":true`}},
		{name: "guest-server/multi-packet", guestServer: true, guest: "rping -s -a $GUEST -V -C 20 -S 10000", guestReady: cmListening,
			host: []string{bin, "-c", "-a", "$GUEST", "-V", "-C", "20", "-S", "10000", "--json"}, hostWant: []string{`"ok":true`}},
	} {
		c.tool, c.mode = "rping", "ordered, rdma_cm; "+modeOf(c.guest)
		t.Run(c.name, func(t *testing.T) { c.run(t, sharedVM(t)) })
	}
}

// TestUcmatose: librdmacm's ucmatose (several rdma_cm connections at once, SENDs on each,
// disconnect) on rxe against softrnic's cmd/ucmatose, both ways.
func TestUcmatose(t *testing.T) {
	sharedVM(t) // skips the whole test where the VM cannot run
	bin := tool(t, "cmd/ucmatose")
	for _, c := range []cell{
		{name: "guest-server", guestServer: true, guest: "ucmatose -b $GUEST -c 4 -C 10 -S 100", guestReady: cmListening,
			host: []string{bin, "-s", "$GUEST", "-c", "4", "-C", "10", "-S", "100", "--json"}, guestWant: []string{"return status 0"}, hostWant: []string{`"ok":true`}},
		{name: "host-server", guest: "ucmatose -s $HOST -c 4 -C 10 -S 100", hostReady: "ucmatose: listening on",
			host: []string{bin, "-b", "$HOST", "-c", "4", "-C", "10", "-S", "100", "--json"}, guestWant: []string{"return status 0"}, hostWant: []string{`"ok":true`}},
	} {
		c.tool, c.mode = "ucmatose", "ordered, rdma_cm; "+modeOf(c.guest)
		t.Run(c.name, func(t *testing.T) { c.run(t, sharedVM(t)) })
	}
}

// TestUdaddy: librdmacm's udaddy (UD services resolved with SIDR, UD SENDs with
// immediate data) on rxe against softrnic's cmd/udaddy, both ways.
func TestUdaddy(t *testing.T) {
	sharedVM(t) // skips the whole test where the VM cannot run
	bin := tool(t, "cmd/udaddy")
	for _, c := range []cell{
		{name: "guest-server", guestServer: true, guest: "udaddy -c 4 -C 20 -S 1024", guestReady: "rdma res show cm_id | grep -q 'LISTEN.*UDP'",
			host: []string{bin, "-s", "$GUEST", "-c", "4", "-C", "20", "-S", "1024", "--json"}, guestWant: []string{"return status 0"}, hostWant: []string{`"ok":true`}},
		{name: "host-server", guest: "udaddy -s $HOST -c 4 -C 20 -S 1024", hostReady: "udaddy: starting server",
			host: []string{bin, "-b", "$HOST", "-c", "4", "-C", "20", "-S", "1024", "--json"}, guestWant: []string{"return status 0"}, hostWant: []string{`"ok":true`}},
	} {
		c.tool, c.mode = "udaddy", "UD, rdma_cm SIDR; "+modeOf(c.guest)
		t.Run(c.name, func(t *testing.T) { c.run(t, sharedVM(t)) })
	}
}

// TestPerftest: perftest's eight tools on rxe against rperf --perftest, both ways, with
// perftest's TCP exchange and with -R (the exchange and the test's QPs over rdma_cm): the
// result line perftest prints on both sides.
func TestPerftest(t *testing.T) {
	sharedVM(t) // skips the whole test where the VM cannot run
	bin := tool(t, "cmd/rperf")
	for _, test := range []string{"write_bw", "read_bw", "send_bw", "atomic_bw", "write_lat", "read_lat", "send_lat", "atomic_lat"} {
		n := "100"
		if strings.HasSuffix(test, "_lat") {
			n = "200"
		}
		ib := "ib_" + test + " -d rxe0 -x $SOFTRNIC_GID_INDEX -n " + n
		ibR := "ib_" + test + " -d rxe0 -R -n " + n
		for _, c := range []cell{
			{name: test + "/guest-server", guestServer: true, guest: ib, guestReady: tcpListening(18515),
				host: []string{bin, test, "--perftest", "$GUEST", "-n", n, "--stats"}, hostWant: []string{"#bytes"}, mode: "TCP exchange"},
			{name: test + "/host-server", guest: ib + " $HOST", hostReady: "server waiting on TCP port",
				host: []string{bin, test, "-n", n, "--stats", "--dev-addr", "$HOST"}, guestWant: []string{"#bytes"}, mode: "TCP exchange"},
			{name: test + "/R/guest-server", guestServer: true, guest: ibR, guestReady: cmListening,
				host: []string{bin, test, "--perftest", "-R", "$GUEST", "-n", n, "--stats"}, hostWant: []string{"#bytes"}, mode: "rdma_cm (-R)"},
			{name: test + "/R/host-server", guest: ibR + " $HOST", hostReady: "server waiting on TCP port",
				host: []string{bin, test, "-R", "-n", n, "--stats", "--dev-addr", "$HOST"}, guestWant: []string{"#bytes"}, mode: "rdma_cm (-R)"},
		} {
			c.tool, c.mode = "ib_"+test, "ordered, "+c.mode+"; "+modeOf(c.guest)
			t.Run(c.name, func(t *testing.T) { c.run(t, sharedVM(t)) })
		}
	}
}

// TestLossyLink: with the guest's link dropping 1 % of the packets each way and
// delaying and reordering some (netem on eth0's egress, and on its ingress through an
// ifb device), transfers between rxe and softrnic (ordered mode: rxe has no other) stay
// byte-exact in both directions, and both sides recover: rping validates every buffer
// READ and WRITE back, ibv_rc_pingpong's softrnic side checks every byte of every
// multi-packet SEND.
func TestLossyLink(t *testing.T) {
	vm := sharedVM(t)
	const netem = "delay 1ms reorder 20% 50% loss 1%"
	setup := "modprobe -q sch_netem ifb act_mirred cls_matchall 2>/dev/null; " +
		"ip link add ifb9 type ifb && ip link set ifb9 up && " +
		"tc qdisc add dev eth0 root netem " + netem + " && " +
		"tc qdisc add dev eth0 handle ffff: ingress && " +
		"tc filter add dev eth0 parent ffff: matchall action mirred egress redirect dev ifb9 && " +
		"tc qdisc add dev ifb9 root netem " + netem
	execOK(t, vm, time.Minute, setup)
	t.Cleanup(func() {
		execOK(t, vm, time.Minute, "tc qdisc del dev eth0 root; tc qdisc del dev eth0 ingress; ip link del ifb9; true")
	})
	t.Log(execOK(t, vm, time.Minute, "tc -s qdisc show dev eth0; tc -s qdisc show dev ifb9"))
	rping, pp := tool(t, "cmd/rping"), tool(t, "cmd/pingpong")
	for _, c := range []cell{
		{name: "rping/guest-server", guestServer: true, guest: "rping -s -a $GUEST -V -C 30 -S 10000", guestReady: cmListening,
			host: []string{rping, "-c", "-a", "$GUEST", "-V", "-C", "30", "-S", "10000", "--json"}, hostWant: []string{`"ok":true`}},
		{name: "rping/host-server", guest: "rping -c -a $HOST -V -C 30 -S 10000", hostReady: "rping: listening on",
			host: []string{rping, "-s", "-a", "$HOST", "-V", "-S", "10000", "--json"}, hostWant: []string{`"ok":true`}},
		{name: "rc_pingpong/guest-server", guestServer: true, guest: "ibv_rc_pingpong -d rxe0 -g $SOFTRNIC_GID_INDEX -n 300 -s 8192 -c",
			guestReady: tcpListening(18515), host: []string{pp, "rc", "-g", "1", "-n", "300", "-s", "8192", "-c", "--json", "$GUEST"},
			guestWant: []string{"300 iters in"}, hostWant: []string{`"checked":true`}},
		{name: "rc_pingpong/host-server", guest: "ibv_rc_pingpong -d rxe0 -g $SOFTRNIC_GID_INDEX -n 300 -s 8192 -c $HOST",
			hostReady: "local address:", host: []string{pp, "rc", "-g", "1", "-n", "300", "-s", "8192", "-c", "--json", "-d", "$HOST"},
			guestWant: []string{"300 iters in"}, hostWant: []string{`"checked":true`}},
	} {
		c.lossy, c.timeout = true, 5*time.Minute
		c.tool, c.mode = strings.Fields(c.guest)[0], "ordered, 1 % loss each way, reordering; "+modeOf(c.guest)
		t.Run(c.name, func(t *testing.T) { c.run(t, sharedVM(t)) })
	}
	t.Log(execOK(t, vm, time.Minute, "tc -s qdisc show dev eth0; tc -s qdisc show dev ifb9"))
}

// checkRxe fails t for each error rxe counted over a cell: sequence errors (unless the
// link is lossy, where they are the loss), retries exhausted, send errors, and the extra
// counters named.
func checkRxe(t *testing.T, rxe rxevm.Counters, lossy bool, extra ...string) {
	t.Helper()
	names := []string{"retry_exceeded_err", "retry_rnr_exceeded_err", "send_err"}
	if !lossy {
		names = append(names, "rcvd_seq_err", "out_of_seq_request")
	}
	for _, name := range append(names, extra...) {
		if rxe[name] != 0 {
			t.Errorf("rxe counter %s = %d", name, rxe[name])
		}
	}
}

// lastACKLost tells the ways a lossy link ends ibv_rc_pingpong without a fault of either
// side from real failures.
func TestLastACKLost(t *testing.T) {
	guest := "ibv_rc_pingpong -d rxe0 -g $SOFTRNIC_GID_INDEX -n 300 -s 8192 -c"
	hostOK := `{"test":"rc_pingpong","role":"server","iters":300,"bytes":4915200,"checked":true}`
	all := map[string]uint64{"rdma_recvs": 300}
	short := map[string]uint64{"rdma_recvs": 299}
	guestServer := cell{tool: "ibv_rc_pingpong", guest: guest, lossy: true, guestServer: true}
	guestClient := cell{tool: "ibv_rc_pingpong", guest: guest, lossy: true}
	retryExc := "Failed status transport retry counter exceeded (12) for wr_id 2"
	hostExc := "transport retry counter exceeded (12) for wr_id 2 (x) after 299 of 300 iterations (received 300, sent 299)"
	for _, tc := range []struct {
		name     string
		c        cell
		guestRC  int
		stuck    bool
		guestOut string
		hostErr  error
		hostOut  string
		rxe      map[string]uint64
		want     string
	}{
		{"guest server retried out", guestServer, 1, false, retryExc, nil, hostOK, all, "guest"},
		{"host server retried out", guestClient, 0, false, "300 iters in 2.9 seconds", errors.New("exit 1"), hostExc, nil, "host"},
		{"rxe client retrying for ever", guestClient, 143, true, "", nil, hostOK, all, "guest"},
		{"rxe client stuck short of a reply", guestClient, 143, true, "", nil, hostOK, short, ""},
		{"rxe client stuck, softrnic failed", guestClient, 143, true, "", errors.New("exit 1"), hostOK, all, ""},
		{"rxe client ended by the cell's deadline", guestClient, 143, false, "", nil, hostOK, all, ""},
		{"not lossy", cell{tool: "ibv_rc_pingpong", guest: guest}, 143, true, "", nil, hostOK, all, ""},
	} {
		if got := tc.c.lastACKLost(tc.guestRC, tc.stuck, tc.guestOut, tc.hostErr, tc.hostOut, tc.rxe); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

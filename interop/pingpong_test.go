//go:build linux

package interop

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/softrnic/softrnic/interop/rxevm"
	"github.com/softrnic/softrnic/verbs"
)

// TestPingpong runs softrnic's cmd/pingpong against rdma-core's ibv_rc_pingpong and
// ibv_ud_pingpong on the guest's rxe0, each side once the server and once the client:
// the same TCP exchange (port 18515), SENDs of one packet and of several (4096 bytes at
// MTU 1024, and at -m 512), UD at the active MTU, the completion channel (-e), every
// message checked (-c). Both tools must succeed with the C tools' result lines; softrnic's
// device must count no ICRC error, malformed packet, unknown QP, foreign source, drop,
// NAK or out-of-sequence packet; rxe no sequence error, NAK, RNR or retry exhaustion; and
// every packet on the bridge must carry a valid ICRC (checked here from the real IPv4
// header). Under TCG rxe's retransmission timer fires early now and then (it is armed
// once and not moved as ACKs arrive), so rxe's completer_retry_err and softrnic's
// duplicates are logged, not failed.
func TestPingpong(t *testing.T) {
	vm := sharedVM(t)
	bin := filepath.Join(t.TempDir(), "pingpong")
	build := exec.Command("go", "build", "-o", bin, "github.com/softrnic/softrnic/cmd/pingpong")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cells := []struct {
		name  string
		mode  string
		flags string // both sides
	}{
		{"rc/64", "rc", "-n 100 -s 64 -c"},
		{"rc/4096", "rc", "-n 1000 -s 4096 -c"},
		{"rc/4096/mtu512/events", "rc", "-n 200 -s 4096 -m 512 -e -c"},
		{"ud/1024", "ud", "-n 1000 -s 1024 -c"}, // the active MTU: ud_pingpong's largest
		{"ud/256/events", "ud", "-n 200 -s 256 -e -c"},
	}
	for _, c := range cells {
		for _, guestServer := range []bool{true, false} {
			role := "host-server"
			if guestServer {
				role = "guest-server"
			}
			t.Run(c.name+"/"+role, func(t *testing.T) {
				ppCell(t, vm, bin, c.mode, c.flags, guestServer)
			})
		}
	}
}

// ppResult is what cmd/pingpong --json prints (the fields the test reads).
type ppResult struct {
	Test         string          `json:"test"`
	Role         string          `json:"role"`
	Size         int             `json:"size"`
	Iters        int             `json:"iters"`
	Seconds      float64         `json:"seconds"`
	UsecPerIter  float64         `json:"usec_per_iter"`
	Checked      bool            `json:"checked"`
	InvalidPages []int           `json:"invalid_pages"`
	BadMessages  int             `json:"bad_messages"`
	Device       *verbs.Counters `json:"device_counters"`
}

func ppCell(t *testing.T, vm *rxevm.VM, bin, mode, flags string, guestServer bool) {
	kind := "ordered, TCP exchange; "
	if mode == "ud" {
		kind = "UD, TCP exchange; "
	}
	record(t, "ibv_"+mode+"_pingpong", guestServer, kind+flags)
	in := vm.Info()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	guestTool := "ibv_" + mode + "_pingpong -d " + in.Device + " -g $SOFTRNIC_GID_INDEX " + flags
	hostArgs := append([]string{mode, "-g", "1", "--json", "--stats", "--timeout", "3m"}, strings.Fields(flags)...)

	before, err := vm.Counters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	capPath := filepath.Join(t.TempDir(), "pingpong.pcap")
	stopCapture, err := ppCapture(ctx, vm, capPath)
	if err != nil {
		t.Fatal(err)
	}

	var hostOut, hostErr bytes.Buffer
	var guestOut, guestErr string
	var guestRC int
	var hostRunErr error
	if guestServer {
		srv, err := vm.Spawn(guestTool)
		if err != nil {
			t.Fatal(err)
		}
		if err := vm.WaitUntil(ctx, "ss -Hltn 'sport = :18515' | grep -q ."); err != nil {
			t.Fatal(err)
		}
		cmd := vm.HostCommand(ctx, bin, append(hostArgs, in.GuestAddr.String())...)
		cmd.Stdout, cmd.Stderr = &hostOut, &hostErr
		hostRunErr = cmd.Run()
		if hostRunErr != nil {
			_ = srv.Signal("TERM") // the client failed: do not wait for the server's iterations
		}
		guestOut, guestErr, guestRC, err = srv.Wait(ctx)
		if err != nil {
			t.Errorf("guest server: %v", err)
		}
	} else {
		cmd := vm.HostCommand(ctx, bin, append(hostArgs, "-d", in.HostAddr.String())...)
		cmd.Stdout = &hostOut
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// The server prints its local address line once it listens.
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			hostErr.WriteString(sc.Text() + "\n")
			if strings.Contains(sc.Text(), "local address:") {
				break
			}
		}
		guestOut, guestErr, guestRC, err = vm.Exec(ctx, guestTool+" "+in.HostAddr.String())
		if err != nil {
			t.Errorf("guest client: %v", err)
		}
		for sc.Scan() {
			hostErr.WriteString(sc.Text() + "\n")
		}
		hostRunErr = cmd.Wait()
	}
	capErr := stopCapture()
	after, err := vm.Counters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rxe := after.Sub(before)
	t.Logf("guest (%s):\n%s%s", guestTool, guestOut, guestErr)
	t.Logf("host (pingpong %s):\n%s%s", strings.Join(hostArgs, " "), hostErr.String(), hostOut.String())
	t.Logf("rxe counters: %v", rxe)

	// Both tools succeeded, with the C tools' lines and no invalid data.
	n, _ := strconv.Atoi(strings.Fields(flags)[1])
	if guestRC != 0 || !strings.Contains(guestOut, fmt.Sprintf("%d iters in ", n)) || strings.Contains(guestOut, "invalid data") {
		t.Errorf("guest tool: exit %d", guestRC)
	}
	if hostRunErr != nil {
		t.Fatalf("host pingpong: %v", hostRunErr)
	}
	var r ppResult
	if err := json.Unmarshal(hostOut.Bytes(), &r); err != nil {
		t.Fatalf("host pingpong's JSON: %v", err)
	}
	if r.Test != mode+"_pingpong" || r.Iters != n || !r.Checked || len(r.InvalidPages) > 0 || r.BadMessages > 0 || r.Device == nil {
		t.Fatalf("host result %+v", r)
	}
	d := r.Device
	t.Logf("softrnic device: tx %d rx %d, retransmits %d, timeouts %d, duplicates %d", d.TxPackets, d.RxPackets, d.Retransmits, d.Timeouts, d.Duplicates)
	for name, v := range map[string]uint64{"ICRCErrors": d.ICRCErrors, "Malformed": d.Malformed, "UnknownQP": d.UnknownQP,
		"WrongSource": d.WrongSource, "WrongMode": d.WrongMode, "Dropped": d.Dropped, "QKeyErrors": d.QKeyErrors,
		"NAKsSent": d.NAKsSent, "NAKsReceived": d.NAKsReceived, "RNRNAKsSent": d.RNRNAKsSent, "RNRNAKsReceived": d.RNRNAKsReceived,
		"OutOfSequence": d.OutOfSequence, "SendErrors": d.SendErrors} {
		if v != 0 {
			t.Errorf("softrnic device counter %s = %d", name, v)
		}
	}
	checkRxe(t, rxe, false, "rcvd_rnr_err", "send_rnr_err")

	// Every RoCEv2 packet on the bridge, each way, with a valid ICRC.
	if capErr != nil {
		t.Fatalf("capture: %v", capErr)
	}
	wr, err := CheckCapture(capPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := wr.Err(); err != nil {
		t.Error(err)
	}
	toGuest, toHost := wr.Count(in.HostAddr, in.GuestAddr), wr.Count(in.GuestAddr, in.HostAddr)
	t.Logf("bridge: host→guest %d packets (softrnic sent %d), guest→host %d (rxe sent %d), every ICRC checked", toGuest, d.TxPackets, toHost, rxe["sent_pkts"])
	if uint64(toGuest) != d.TxPackets || uint64(toHost) != rxe["sent_pkts"] {
		t.Errorf("the bridge carried host→guest %d packets, guest→host %d; softrnic counted %d sent, rxe %d", toGuest, toHost, d.TxPackets, rxe["sent_pkts"])
	}
}

// ppCapture starts tcpdump on the VM's bridge, writing every RoCEv2 packet to path, and
// returns once it captures. Its stop function ends it and fails if the kernel dropped
// packets. (--immediate-mode and a large buffer: VM.Capture's tcpdump, without them,
// lost the last packets of a short run at SIGTERM, all of them in runs under a second.)
func ppCapture(ctx context.Context, vm *rxevm.VM, path string) (stop func() error, err error) {
	cmd := vm.HostCommand(ctx, "tcpdump", "--immediate-mode", "-U", "-B", "32768", "-Z", "root", "-n",
		"-i", vm.Info().Bridge, "-w", path, "udp", "port", "4791")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("tcpdump: %w", err)
	}
	var mu sync.Mutex
	var msgs strings.Builder
	listening, rest := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(rest)
		sc := bufio.NewScanner(stderr)
		for up := false; sc.Scan(); {
			mu.Lock()
			msgs.WriteString(sc.Text() + "\n")
			mu.Unlock()
			if !up && strings.Contains(sc.Text(), "listening on ") {
				up = true
				close(listening)
			}
		}
	}()
	text := func() string { mu.Lock(); defer mu.Unlock(); return strings.TrimSpace(msgs.String()) }
	select {
	case <-listening:
	case <-rest:
		cmd.Wait()
		return nil, fmt.Errorf("tcpdump did not start: %s", text())
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		<-rest
		cmd.Wait()
		return nil, fmt.Errorf("tcpdump not capturing after a minute: %s", text())
	}
	return func() error {
		_ = cmd.Process.Signal(os.Interrupt)
		<-rest
		_ = cmd.Wait()
		out := text()
		n, ok := kernelDrops(out)
		switch {
		case !ok:
			return fmt.Errorf("tcpdump ended without its statistics: %s", out)
		case n != 0:
			return &captureDropError{n, out}
		}
		return nil
	}, nil
}

// kernelDrops reads the count of tcpdump's last statistics line, "N packets dropped by
// kernel" ("1 packet dropped by kernel": tcpdump writes the singular for one).
func kernelDrops(stderr string) (n int, ok bool) {
	for _, line := range strings.Split(stderr, "\n") {
		for _, suffix := range []string{" packets dropped by kernel", " packet dropped by kernel"} {
			if num, found := strings.CutSuffix(strings.TrimSpace(line), suffix); found {
				v, err := strconv.Atoi(num)
				return v, err == nil
			}
		}
	}
	return 0, false
}

// captureDropError says the kernel dropped packets before tcpdump read them (a burst of
// thousands under emulation): what was captured is still checked.
type captureDropError struct {
	dropped int
	out     string
}

func (e *captureDropError) Error() string {
	return fmt.Sprintf("tcpdump: %d packets dropped by the kernel: %s", e.dropped, e.out)
}

func TestKernelDrops(t *testing.T) {
	for _, c := range []struct {
		in string
		n  int
		ok bool
	}{
		{"listening on br0\n12 packets captured\n12 packets received by filter\n0 packets dropped by kernel", 0, true},
		{"41869 packets captured\n41870 packets received by filter\n1 packet dropped by kernel", 1, true},
		{"9 packets dropped by kernel\n", 9, true},
		{"tcpdump: listening on br0", 0, false},
	} {
		if n, ok := kernelDrops(c.in); n != c.n || ok != c.ok {
			t.Errorf("kernelDrops(%q) = %d, %v; want %d, %v", c.in, n, ok, c.n, c.ok)
		}
	}
}

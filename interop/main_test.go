//go:build linux

package interop

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/softrnic/softrnic/interop/rxevm"
)

// shared is the package's VM: booted once per test run by the first test that needs it
// (sharedVM), closed by TestMain after the last test or on SIGINT/SIGTERM.
var shared struct {
	once  sync.Once
	mu    sync.Mutex // held while booting and closing
	vm    *rxevm.VM
	extra []*rxevm.VM // VMs of single tests (ownVM), for closing on a signal
	skip  error       // why the VM cannot run here
	err   error       // the boot failed
	log   []string
}

// stop is cancelled on SIGINT/SIGTERM: a boot in progress gives up (and cleans up).
var stop, stopAll = context.WithCancel(context.Background())

// sharedConfig is the configuration of the shared VM (its Name: see vmName).
var sharedConfig = rxevm.Config{MTU: 1500}

// slots is Config.Slots for the package's VMs: up to 4 runs of the package (several
// people in one checkout) boot their VMs side by side; a fifth waits.
const slots = 4

// vmName is the VM name (network namespace) for suffix: $SOFTRNIC_INTEROP_NAME, else
// rxevm.DefaultName, and "-suffix" if suffix is not empty. With slots, a VM takes the
// first free of that name and name-2 ... name-4.
func vmName(suffix string) string {
	n := os.Getenv("SOFTRNIC_INTEROP_NAME")
	if n == "" {
		n = rxevm.DefaultName
	}
	if suffix != "" {
		n += "-" + suffix
	}
	return n
}

func TestMain(m *testing.M) {
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sigc
		fmt.Fprintf(os.Stderr, "interop: %v: powering the VM off\n", s)
		stopAll()
		closeShared()
		os.Exit(1)
	}()
	code := m.Run()
	printMatrix(os.Stdout)
	closeShared()
	os.Exit(code)
}

func closeShared() {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	for _, vm := range append(shared.extra, shared.vm) {
		if vm != nil {
			if err := vm.Close(); err != nil {
				fmt.Fprintln(os.Stderr, "interop:", err)
			}
		}
	}
	shared.vm, shared.extra = nil, nil
}

// ownVM boots a VM for one test (another MTU, say), closed when the test ends. Its
// Config.Name must differ from the shared VM's (each name is a namespace): use
// vmName("something"). Skips and fails as sharedVM does.
func ownVM(t *testing.T, cfg rxevm.Config) *rxevm.VM {
	t.Helper()
	if testing.Short() {
		t.Skip("interop: skipped under -short (boots a VM: 10-25 s)")
	}
	if err := gate(); err != nil {
		if os.Getenv("SOFTRNIC_INTEROP") == "require" {
			t.Fatalf("SOFTRNIC_INTEROP=require: %v", err)
		}
		t.Skip(err)
	}
	cfg.Logf = func(format string, args ...any) { t.Logf(format, args...) }
	if cfg.Slots == 0 {
		cfg.Slots = slots
	}
	shared.mu.Lock() // so that a signal closes it too
	vm, err := rxevm.Start(stop, cfg)
	if err == nil {
		shared.extra = append(shared.extra, vm)
	}
	shared.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := vm.Close(); err != nil {
			t.Error(err)
		}
	})
	return vm
}

// longCell returns why, for a cell that CI leaves out (minutes long, or not yet known to
// pass every time), or "" when SOFTRNIC_INTEROP_LONG=on asks for such cells.
func longCell(why string) string {
	if os.Getenv("SOFTRNIC_INTEROP_LONG") == "on" {
		return ""
	}
	return why + " (SOFTRNIC_INTEROP_LONG=on runs it)"
}

// gate says why the suite does not run here, or nil. It runs only when asked to
// (SOFTRNIC_INTEROP=on, or require), so that go test ./... stays quick where the
// packages happen to be installed: it boots a VM and takes minutes.
func gate() error {
	switch v := os.Getenv("SOFTRNIC_INTEROP"); v {
	case "on", "1", "require":
		return rxevm.Available()
	case "", "off":
		return fmt.Errorf("interop: the suite against Linux rxe runs with SOFTRNIC_INTEROP=on (boots a QEMU VM; about 6 minutes); see interop/README.md")
	default:
		return fmt.Errorf("interop: SOFTRNIC_INTEROP=%q: want on, require or off", v)
	}
}

// sharedVM returns the package's VM, booting it on first use. It skips the test under
// -short and when the VM cannot run here (unless SOFTRNIC_INTEROP=require), and fails it
// when the boot failed.
func sharedVM(t testing.TB) *rxevm.VM {
	t.Helper()
	if testing.Short() {
		t.Skip("interop: skipped under -short (boots a VM: 10-25 s)")
	}
	shared.once.Do(func() {
		shared.mu.Lock()
		defer shared.mu.Unlock()
		if err := gate(); err != nil {
			shared.skip = err
			return
		}
		bootShared()
	})
	if shared.skip != nil {
		if os.Getenv("SOFTRNIC_INTEROP") == "require" {
			t.Fatalf("SOFTRNIC_INTEROP=require: %v", shared.skip)
		}
		t.Skip(shared.skip)
	}
	shared.mu.Lock()
	vm, err := shared.vm, shared.err
	shared.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			checkShared(t, vm)
		}
	})
	return vm
}

// bootShared boots the shared VM (shared.mu held).
func bootShared() {
	cfg := sharedConfig
	cfg.Name = vmName("")
	cfg.Slots = slots
	cfg.Logf = func(format string, args ...any) {
		line := time.Now().Format("15:04:05.000 ") + fmt.Sprintf(format, args...)
		shared.log = append(shared.log, line)
		if strings.Contains(line, "waiting for pid") { // say at once why nothing happens
			fmt.Fprintln(os.Stderr, line)
		}
	}
	shared.vm, shared.err = rxevm.Start(stop, cfg)
}

// checkShared runs after a test of the shared VM failed: the guest must still reach the
// host (the ping needs the guest's transmit and receive paths both). When it does not,
// the guest is reported and booted again, so that one guest whose network stopped fails
// one test, not every test after it. Tests take the VM once at their start (sharedVM):
// the new guest serves the tests that follow.
func checkShared(t testing.TB, vm *rxevm.VM) {
	shared.mu.Lock()
	replaced := shared.vm != vm // a failed subtest's check booted it again already
	shared.mu.Unlock()
	if replaced {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, stderr, rc, err := vm.Exec(ctx, "busybox ping -c 2 -W 5 $HOST_IP")
	if err == nil && rc == 0 {
		return
	}
	t.Logf("interop: after this failure the guest no longer reaches the host (ping: rc %d, %v): %s%s", rc, err, out, stderr)
	if diag, _, _, err := vm.Exec(ctx, "head -n 2 /proc/net/dev; grep eth0 /proc/net/dev; dmesg | grep -i -E 'netdev watchdog|timed out|warning|bug:|call trace|blocked for|rxe' | tail -n 40"); err == nil {
		t.Logf("guest eth0 counters and kernel messages:\n%s", diag)
	}
	if hc, err := vm.HostCommand(ctx, "ip", "-s", "link", "show", vm.Info().Tap).CombinedOutput(); err == nil {
		t.Logf("host side of the guest's link:\n%s", hc)
	}
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.vm != vm {
		return
	}
	if err := vm.Close(); err != nil {
		t.Logf("interop: closing the stopped guest: %v", err)
	}
	bootShared()
	if shared.err != nil {
		t.Logf("interop: booting the guest again: %v", shared.err)
		return
	}
	t.Logf("interop: the guest was booted again for the tests that follow")
}

// exec runs a guest command that must succeed, within d.
func execOK(t testing.TB, vm *rxevm.VM, d time.Duration, cmd string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	out, stderr, rc, err := vm.Exec(ctx, cmd)
	if err != nil || rc != 0 {
		t.Fatalf("guest %q: rc %d, err %v\nstdout: %s\nstderr: %s", cmd, rc, err, out, stderr)
	}
	return out
}

//go:build linux

// Package rxevm boots the Linux kernel's soft-RoCE driver (rdma_rxe) in a small QEMU
// virtual machine, as a real RoCEv2 peer for softrnic's interoperability tests.
//
// The machine running the tests needs no RDMA stack of its own: the guest is Debian's stock
// kernel (package linux-image-amd64) with the host's root filesystem shared read-only over
// virtio-9p under a tmpfs overlay, so the guest runs the host's own rdma-core, perftest and
// rdmacm-utils binaries (and any binary a test builds) against a real kernel RDMA stack:
// rxe0 on eth0. The guest's eth0 is a virtio-net NIC on a tap in a network namespace made
// for the VM, so a host program run in that namespace exchanges RoCEv2 packets (UDP 4791)
// with rxe0, without NAT (which would rewrite addresses under the ICRC):
//
//	network namespace Config.Name ("softrnic-interop"), nothing leaves it
//	┌──────────────────────────────────────────────────────────────────────────┐
//	│ host programs ── br0 10.77.1.1/24 (bridge, MAC 52:54:00:77:01:01)        │
//	│ (HostCommand,         └── tap0 ── QEMU: eth0 10.77.1.2 (52:54:00:77:01:02) │
//	│  InNamespace)                          rxe0, GID index 1 = ::ffff:10.77.1.2 │
//	└──────────────────────────────────────────────────────────────────────────┘
//	static ARP entries on both sides; IPv6 off on every link
//
// Start builds a 1.6 MB initramfs (cached in the work directory), creates the namespace,
// bridge and tap, boots the guest and returns once rxe0 is PORT_ACTIVE with the RoCEv2 GID
// of its address. The guest then serves commands over a virtio-serial control channel (a
// unix socket on the host side): Exec runs a shell command and waits, Spawn starts one in
// the background. Their output goes through a second 9p share (cache=none), mounted in the
// guest at the same path as on the host; SharedDir is a directory in it for files a test
// wants the guest to see at once (test binaries, say).
//
// Cleanup: Close powers the guest off, reaps QEMU (its child; killed by its pid only if it
// does not stop) and deletes the namespace with the bridge and tap. If the test process
// dies instead, QEMU gets SIGKILL from the kernel (it is started with a parent-death
// signal) and the guest powers itself off when its control channel closes; the next Start
// with the same Name kills a QEMU still recorded in its pid file and deletes the leftover
// namespace. Start holds a lock per name for the VM's lifetime, so concurrent runs with
// the same name wait for each other, or take the next free name with Config.Slots.
// Nothing is ever killed by name, and no namespace other than the VM's is touched.
//
// Under TCG (no usable KVM) the guest is slow: boot takes 10-25 s and an Exec 0.2-0.5 s.
// Timings measured on it have no performance meaning.
package rxevm

import (
	"bufio"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/internal/testutil"
)

// DefaultName is the default Config.Name: the network namespace and work subdirectory.
const DefaultName = "softrnic-interop"

// The link between host and guest. Each VM has a namespace of its own, so every VM uses
// the same addresses.
var (
	HostAddr  = netip.MustParseAddr("10.77.1.1")
	GuestAddr = netip.MustParseAddr("10.77.1.2")
)

const (
	prefixLen = 24
	hostMAC   = "52:54:00:77:01:01"
	guestMAC  = "52:54:00:77:01:02"
	bridgeDev = "br0"  // inside the VM's namespace
	tapDev    = "tap0" // inside the VM's namespace
	rxeDev    = "rxe0"
	qemuBin   = "qemu-system-x86_64"

	// guest kernel arguments that shorten the boot a little; none is needed
	kernelArgs = "mitigations=off audit=0 i8042.noaux i8042.nokbd i8042.nopnp 8250.nr_uarts=1 tsc=reliable no_timer_check"
)

//go:embed guest/guest-init.sh
var guestInit []byte

// Config says how to run the VM. The zero value is usable.
type Config struct {
	// Name names the network namespace and the VM's subdirectory of WorkDir
	// (default DefaultName). Letters, digits, '-' and '_'; VMs with different names can
	// run at the same time. One VM at a time has a name: Start waits for a VM of the
	// same name (in any process) to close, unless Slots gives it other names to take.
	Name string
	// Slots > 1 lets Start take the first name of Name, Name-2, ..., Name-<Slots> that
	// no running VM has, and wait (for Name) only when all are taken. Info.Name says which.
	// A small fixed set of names keeps the cleanup after a crashed run working: the next
	// Start that takes the name deletes what is left. Default 1.
	Slots int
	// MTU is the link MTU of the bridge, tap and guest eth0 (default 1500). rxe's
	// active_mtu follows it: 1500 gives 1024, 9000 gives 4096.
	MTU int
	// MemoryMiB is the guest's memory (default 1024; touched pages only are used).
	MemoryMiB int
	// CPUs is the guest's CPU count (default 1).
	CPUs int
	// BootTimeout bounds the boot, from the network setup to rxe0 ACTIVE (default 60 s
	// with KVM, 300 s under TCG). The context passed to Start bounds all of Start,
	// including the wait for another run with the same Name.
	BootTimeout time.Duration
	// WorkDir holds the initramfs cache and one subdirectory per Name
	// (default os.TempDir()/softrnic-interop). No whitespace. (The locks that keep two
	// VMs from taking one name are in /run/softrnic-interop, whatever WorkDir is.)
	WorkDir string
	// Kernel is the guest kernel version (a /boot/vmlinuz-<Kernel> with rdma_rxe under
	// /lib/modules/<Kernel>); default the newest such kernel.
	Kernel string
	// Accel is "kvm", "tcg" or "auto" (default: $SOFTRNIC_INTEROP_ACCEL, else "auto":
	// probe once per kernel whether it boots under KVM, cache the answer in WorkDir).
	Accel string
	// RootCache is the 9p cache mode of the host root in the guest: "loose" (default,
	// faster; a host file changed after the guest read it may look stale) or "none".
	// SharedDir is always cache=none.
	RootCache string
	// Logf, if set, receives progress lines (boot steps with the guest's uptime).
	Logf func(format string, args ...any)
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`)

func (c Config) withDefaults() Config {
	if c.Name == "" {
		c.Name = DefaultName
	}
	if c.Slots == 0 {
		c.Slots = 1
	}
	if c.MTU == 0 {
		c.MTU = 1500
	}
	if c.MemoryMiB == 0 {
		c.MemoryMiB = 1024
	}
	if c.CPUs == 0 {
		c.CPUs = 1
	}
	if c.WorkDir == "" {
		c.WorkDir = filepath.Join(os.TempDir(), "softrnic-interop")
	}
	if c.Accel == "" {
		c.Accel = os.Getenv("SOFTRNIC_INTEROP_ACCEL")
	}
	if c.Accel == "" {
		c.Accel = "auto"
	}
	if c.RootCache == "" {
		c.RootCache = "loose"
	}
	return c
}

func (c Config) validate() error {
	switch {
	case !nameRE.MatchString(c.Name):
		return fmt.Errorf("rxevm: Config.Name %q: want letters, digits, '-', '_'", c.Name)
	case c.Slots < 1 || c.Slots > 16:
		return fmt.Errorf("rxevm: Config.Slots %d out of 1..16", c.Slots)
	case c.MTU < 1280 || c.MTU > 9000:
		return fmt.Errorf("rxevm: Config.MTU %d out of 1280..9000", c.MTU)
	case c.MemoryMiB < 256:
		return fmt.Errorf("rxevm: Config.MemoryMiB %d: want at least 256", c.MemoryMiB)
	case c.CPUs < 1 || c.CPUs > 64:
		return fmt.Errorf("rxevm: Config.CPUs %d out of 1..64", c.CPUs)
	case c.Accel != "auto" && c.Accel != "kvm" && c.Accel != "tcg":
		return fmt.Errorf("rxevm: Config.Accel %q: want auto, kvm or tcg", c.Accel)
	case c.RootCache != "loose" && c.RootCache != "none":
		return fmt.Errorf("rxevm: Config.RootCache %q: want loose or none", c.RootCache)
	case !filepath.IsAbs(c.WorkDir) || strings.ContainsAny(c.WorkDir, " \t\n\"'\\"):
		return fmt.Errorf("rxevm: Config.WorkDir %q: want an absolute path without whitespace or quotes", c.WorkDir)
	}
	// the control socket's path must fit a sockaddr_un
	if n := len(filepath.Join(c.WorkDir, slotName(c.Name, c.Slots), "ctl.sock")); n > 100 {
		return fmt.Errorf("rxevm: Config.WorkDir %q is too long for a unix socket path (%d bytes)", c.WorkDir, n)
	}
	return nil
}

// Info is what a test needs to know about a running VM.
type Info struct {
	Name      string     // the network namespace (Config.Name)
	Kernel    string     // guest kernel version
	Accel     string     // "tcg" or "kvm"
	HostAddr  netip.Addr // the host's address on the bridge, 10.77.1.1
	GuestAddr netip.Addr // the guest's eth0 address, 10.77.1.2
	HostGID   netip.Addr // the host's RoCEv2 GID as the guest sees it, ::ffff:10.77.1.1
	GuestGID  netip.Addr // rxe0's RoCEv2 GID, ::ffff:10.77.1.2
	HostMAC   string     // the bridge's MAC address
	GuestMAC  string     // the guest eth0's MAC address
	Bridge    string     // the bridge in the namespace (capture here)
	Tap       string     // the guest's tap in the namespace
	Device    string     // the guest's RDMA device, "rxe0"
	MTU       int        // link MTU
	GIDIndex  int        // index of GuestGID (RoCE v2) in rxe0 port 1's GID table; 1 on rxe
	ActiveMTU int        // rxe0 port 1 active_mtu in bytes (1500 → 1024, 9000 → 4096)
	// BootTime is Start's time from holding the Name's lock to rxe0 ready (initramfs,
	// network, QEMU, guest kernel and setup).
	BootTime time.Duration
	// GuestUptime is the guest's uptime when it became ready (kernel boot included).
	GuestUptime time.Duration
	SharedDir   string // see VM.SharedDir
	QEMUPid     int
}

// VM is a running guest. Its methods are safe for concurrent use.
type VM struct {
	cfg    Config
	info   Info
	dir    string // WorkDir/Name
	share  string // dir/share: the guest sees it at the same path
	lock   *os.File
	slot   int  // cfg.Name is slot number slot of the configured name
	netns  bool // the namespace was created (so Close deletes it)
	ln     net.Listener
	conn   net.Conn
	qemu   *exec.Cmd
	qdone  chan struct{} // closed once QEMU has been reaped
	qerr   error         // QEMU's exit status, valid after qdone
	ready  chan string   // the guest's "ready ..." or "fail ..." line
	rdone  chan struct{} // closed when the control channel's reader ends
	wmu    sync.Mutex    // serializes writes to conn
	mu     sync.Mutex
	jobs   map[string]*Job
	nextID uint64
	dead   error // set once the control channel is gone: no more jobs
	caps   map[*Capture]struct{}
	up     bool // the guest said ready

	closeOnce sync.Once
	closeErr  error
}

// Start boots a VM and returns once rxe0 is ready (see the package comment). The VM must
// be closed with Close. Start fails with the error of Available when something the VM
// needs is missing.
func Start(ctx context.Context, cfg Config) (_ *VM, err error) {
	t0 := time.Now()
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := Available(); err != nil {
		return nil, err
	}
	kver, err := pickKernel(cfg.Kernel)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.WorkDir, 0o755); err != nil {
		return nil, fmt.Errorf("rxevm: %w", err)
	}
	lock, slot, err := lockSlot(ctx, cfg)
	if err != nil {
		return nil, err
	}
	cfg.Name = slotName(cfg.Name, slot)
	v := &VM{
		cfg:   cfg,
		slot:  slot,
		lock:  lock,
		dir:   filepath.Join(cfg.WorkDir, cfg.Name),
		qdone: make(chan struct{}),
		ready: make(chan string, 1),
		rdone: make(chan struct{}),
		jobs:  make(map[string]*Job),
		caps:  make(map[*Capture]struct{}),
	}
	v.share = filepath.Join(v.dir, "share")
	v.info = Info{
		Name: cfg.Name, Kernel: kver, HostAddr: HostAddr, GuestAddr: GuestAddr,
		HostGID: netip.AddrFrom16(HostAddr.As16()), GuestGID: netip.AddrFrom16(GuestAddr.As16()),
		HostMAC: hostMAC, GuestMAC: guestMAC, Bridge: bridgeDev, Tap: tapDev, Device: rxeDev,
		MTU: cfg.MTU, SharedDir: filepath.Join(v.share, "tmp"),
	}
	if w := time.Since(t0); w > time.Second {
		v.logf("waited %v for another run with the same Name", w.Round(time.Millisecond))
	}
	t0 = time.Now() // BootTime leaves the wait for the lock out
	defer func() {
		if err != nil {
			v.Close()
		}
	}()
	if err := v.cleanupStale(ctx); err != nil {
		return nil, err
	}
	initrd, err := buildInitramfs(cfg.WorkDir, kver)
	if err != nil {
		return nil, err
	}
	accel, cpu, err := pickAccel(ctx, cfg, kver)
	if err != nil {
		return nil, err
	}
	v.info.Accel = accel
	if cfg.BootTimeout == 0 {
		cfg.BootTimeout = 60 * time.Second
		if accel == "tcg" {
			cfg.BootTimeout = 300 * time.Second
		}
		v.cfg.BootTimeout = cfg.BootTimeout
	}
	bootCtx, cancel := context.WithTimeout(ctx, cfg.BootTimeout)
	defer cancel()

	if err := v.writeShare(); err != nil {
		return nil, err
	}
	if err := v.netUp(bootCtx); err != nil {
		return nil, err
	}
	sock := filepath.Join(v.dir, "ctl.sock")
	if v.ln, err = net.Listen("unix", sock); err != nil {
		return nil, fmt.Errorf("rxevm: control socket: %w", err)
	}
	args := v.qemuArgs(kver, initrd, accel, cpu, sock)
	v.logf("booting %s (%s, -cpu %s, %d MiB) in netns %s", kver, accel, cpu, cfg.MemoryMiB, cfg.Name)
	if err := v.startQEMU(args); err != nil {
		return nil, err
	}
	tq := time.Now()
	if v.conn, err = v.accept(bootCtx); err != nil {
		return nil, v.bootError(err)
	}
	go v.readLoop()
	var line string
	select {
	case line = <-v.ready:
	case <-v.qdone:
		return nil, v.bootError(fmt.Errorf("QEMU exited during boot (%v)", v.qerr))
	case <-v.rdone:
		// the reader may have queued the line just before ending
		select {
		case line = <-v.ready:
		default:
			return nil, v.bootError(errors.New("control channel closed during boot"))
		}
	case <-bootCtx.Done():
		return nil, v.bootError(fmt.Errorf("not ready after %v: %w", time.Since(tq).Round(time.Millisecond), bootCtx.Err()))
	}
	if rest, ok := strings.CutPrefix(line, "fail "); ok {
		return nil, v.bootError(fmt.Errorf("guest setup failed: %s", rest))
	}
	if err := v.parseReady(line); err != nil {
		return nil, v.bootError(err)
	}
	v.up = true
	v.info.BootTime = time.Since(t0)
	v.logf("ready in %v (QEMU start to ready %v; guest uptime %v): GID index %d, active_mtu %d",
		v.info.BootTime.Round(time.Millisecond), time.Since(tq).Round(time.Millisecond),
		v.info.GuestUptime, v.info.GIDIndex, v.info.ActiveMTU)
	return v, nil
}

// Info returns the VM's facts.
func (v *VM) Info() Info { return v.info }

// SharedDir is a directory that the guest sees at the same path, without caching: a file
// written there on the host is visible in the guest at once (build test binaries here).
// It is emptied by the next Start with the same Name.
func (v *VM) SharedDir() string { return v.info.SharedDir }

// MkdirTemp makes a new directory in SharedDir (os.MkdirTemp's pattern).
func (v *VM) MkdirTemp(pattern string) (string, error) {
	return os.MkdirTemp(v.info.SharedDir, pattern)
}

// ConsoleLog returns the guest's serial console output so far.
func (v *VM) ConsoleLog() string {
	b, _ := os.ReadFile(filepath.Join(v.dir, "console.log"))
	return string(b)
}

// Close powers the guest off, reaps QEMU and deletes the network namespace (with its
// bridge and tap). Jobs still running end with an error. It is safe to call more than once.
func (v *VM) Close() error {
	v.closeOnce.Do(func() { v.closeErr = v.close() })
	return v.closeErr
}

func (v *VM) close() error {
	var errs []error
	v.mu.Lock()
	caps := make([]*Capture, 0, len(v.caps))
	for c := range v.caps {
		caps = append(caps, c)
	}
	v.mu.Unlock()
	for _, c := range caps {
		c.Stop()
	}
	if v.qemu != nil {
		grace := 20 * time.Second
		if v.up {
			v.send("stop") // the guest powers off
		} else {
			grace = 0 // a failed boot: nobody listens for "stop"
		}
		select {
		case <-v.qdone:
		case <-time.After(grace):
			if grace > 0 {
				v.logf("QEMU (pid %d) still running %v after stop; killing it", v.qemu.Process.Pid, grace)
			}
			v.qemu.Process.Kill() // our child: by its pid
			select {
			case <-v.qdone:
			case <-time.After(10 * time.Second):
				errs = append(errs, fmt.Errorf("rxevm: QEMU pid %d did not exit after SIGKILL", v.qemu.Process.Pid))
			}
		}
		os.Remove(filepath.Join(v.dir, "qemu.pid"))
	}
	if v.conn != nil {
		v.conn.Close()
		<-v.rdone
	}
	if v.ln != nil {
		v.ln.Close()
	}
	if v.netns {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := deleteNetns(ctx, v.cfg.Name); err != nil {
			errs = append(errs, err)
		}
		cancel()
	}
	if v.lock != nil {
		v.lock.Close() // releases the flock
	}
	return errors.Join(errs...)
}

func (v *VM) logf(format string, args ...any) {
	if v.cfg.Logf != nil {
		v.cfg.Logf("rxevm %s: "+format, append([]any{v.cfg.Name}, args...)...)
	}
}

// bootError adds the tail of the console log to a boot failure.
func (v *VM) bootError(err error) error {
	con := strings.TrimSpace(v.ConsoleLog())
	if lines := strings.Split(con, "\n"); len(lines) > 40 {
		con = strings.Join(lines[len(lines)-40:], "\n")
	}
	qlog, _ := os.ReadFile(filepath.Join(v.dir, "qemu.log"))
	return fmt.Errorf("rxevm: boot of %s failed: %w\nQEMU log: %s\nconsole (%s):\n%s", v.cfg.Name, err,
		strings.TrimSpace(string(qlog)), filepath.Join(v.dir, "console.log"), con)
}

// lockDir holds a lock file per VM name. The names are network namespaces, which are
// global, so the locks are too (not in Config.WorkDir). A variable for the tests.
var lockDir = "/run/softrnic-interop"

// lockPath is the lock file of the VM name.
func lockPath(name string) string { return filepath.Join(lockDir, name+".lock") }

// slotName is the name of slot i (1-based) of name: name, name-2, name-3, ...
func slotName(name string, i int) string {
	if i == 1 {
		return name
	}
	return name + "-" + strconv.Itoa(i)
}

// lockSlot takes the lock of the first free name of cfg.Name's slots without waiting, or
// waits for cfg.Name's own lock if all are taken. It returns the lock and the slot number
// (1 for cfg.Name itself).
func lockSlot(ctx context.Context, cfg Config) (*os.File, int, error) {
	for i := 1; i <= cfg.Slots; i++ {
		f, _, err := tryLock(lockPath(slotName(cfg.Name, i)))
		if err != nil || f != nil {
			return f, i, err
		}
	}
	f, err := lockFile(ctx, lockPath(cfg.Name), func(holder string) {
		if cfg.Logf != nil {
			cfg.Logf("rxevm %s: waiting for pid %s, which runs a VM with the same name", cfg.Name, holder)
		}
	})
	return f, 1, err
}

// tryLock takes an exclusive flock on path if it is free (f != nil), else returns the pid
// that holds it. The lock is released when f is closed or the process ends.
func tryLock(path string) (f *os.File, holder string, err error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, "", fmt.Errorf("rxevm: %w", err)
	}
	f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, "", fmt.Errorf("rxevm: %w", err)
	}
	err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if err == nil {
		f.Truncate(0)
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
		return f, "", nil
	}
	f.Close()
	if !errors.Is(err, unix.EWOULDBLOCK) {
		return nil, "", fmt.Errorf("rxevm: flock %s: %w", path, err)
	}
	b, _ := os.ReadFile(path)
	return nil, strings.TrimSpace(string(b)), nil
}

// lockFile takes an exclusive flock on path, waiting for it until ctx is done; waiting (if
// not nil) is called once if the lock is busy, with the holder's pid.
func lockFile(ctx context.Context, path string, waiting func(holder string)) (*os.File, error) {
	for {
		f, holder, err := tryLock(path)
		if err != nil || f != nil {
			return f, err
		}
		if waiting != nil {
			waiting(holder)
			waiting = nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("rxevm: %s is held by pid %s (a VM with the same name): %w", path, holder, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// cleanupStale removes what an earlier run with the VM's name left behind (see
// cleanupName), and cleans up after the other names of its slots that no VM has now.
func (v *VM) cleanupStale(ctx context.Context) error {
	if err := cleanupName(ctx, v.cfg, v.cfg.Name); err != nil {
		return err
	}
	base := strings.TrimSuffix(v.cfg.Name, "-"+strconv.Itoa(v.slot))
	for i := 1; i <= v.cfg.Slots; i++ {
		name := slotName(base, i)
		if i == v.slot || (!netnsExists(name) && !fileExists(filepath.Join(v.cfg.WorkDir, name, "qemu.pid"))) {
			continue
		}
		f, _, err := tryLock(lockPath(name))
		if err != nil || f == nil {
			continue // in use (or unusable): not ours to touch
		}
		err = cleanupName(ctx, v.cfg, name)
		f.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// cleanupName removes what an earlier run with name left behind: a QEMU recorded in its
// pid file (if that pid is still a QEMU of its directory), its namespace, its directory.
// The caller holds name's lock, so none of it belongs to a live run.
func cleanupName(ctx context.Context, cfg Config, name string) error {
	logf := func(format string, args ...any) {
		if cfg.Logf != nil {
			cfg.Logf("rxevm %s: "+format, append([]any{name}, args...)...)
		}
	}
	dir := filepath.Join(cfg.WorkDir, name)
	pidFile := filepath.Join(dir, "qemu.pid")
	if pid, ok := ownQEMU(pidFile, dir); ok {
		logf("killing QEMU pid %d left by an earlier run", pid)
		unix.Kill(pid, unix.SIGKILL)
		deadline := time.Now().Add(10 * time.Second)
		for {
			if _, ok := ownQEMU(pidFile, dir); !ok {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("rxevm: QEMU pid %d from an earlier run survives SIGKILL", pid)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if netnsExists(name) {
		logf("deleting network namespace %s left by an earlier run", name)
		if err := deleteNetns(ctx, name); err != nil {
			return err
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("rxevm: %w", err)
	}
	return nil
}

// ownQEMU returns the pid in pidFile if that process is alive (not a zombie) and its
// command line names dir, i.e. it is a QEMU this package started for that directory.
func ownQEMU(pidFile, dir string) (int, bool) {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return 0, false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return 0, false
	}
	args := strings.Split(string(cmdline), "\x00")
	if !strings.HasSuffix(args[0], qemuBin) {
		return 0, false
	}
	return pid, strings.Contains(string(cmdline), dir+"/")
}

func (v *VM) writeShare() error {
	if err := os.MkdirAll(filepath.Join(v.share, "jobs"), 0o755); err != nil {
		return fmt.Errorf("rxevm: %w", err)
	}
	if err := os.MkdirAll(v.info.SharedDir, 0o1777); err != nil {
		return fmt.Errorf("rxevm: %w", err)
	}
	os.Chmod(v.info.SharedDir, 0o1777)
	conf := fmt.Sprintf("VM_NAME='%s'\nGUEST_IP='%s'\nPREFIX='%d'\nGUEST_MAC='%s'\nHOST_IP='%s'\nHOST_MAC='%s'\nMTU='%d'\n",
		v.cfg.Name, GuestAddr, prefixLen, guestMAC, HostAddr, hostMAC, v.cfg.MTU)
	if err := os.WriteFile(filepath.Join(v.share, "config"), []byte(conf), 0o644); err != nil {
		return fmt.Errorf("rxevm: %w", err)
	}
	if err := os.WriteFile(filepath.Join(v.share, "guest-init.sh"), guestInit, 0o755); err != nil {
		return fmt.Errorf("rxevm: %w", err)
	}
	return nil
}

func (v *VM) qemuArgs(kver, initrd, accel, cpu, sock string) []string {
	args := []string{
		"-name", v.cfg.Name, "-machine", "pc", "-accel", accel, "-cpu", cpu,
		"-smp", strconv.Itoa(v.cfg.CPUs), "-m", strconv.Itoa(v.cfg.MemoryMiB),
		"-nodefaults", "-no-user-config", "-display", "none", "-vga", "none", "-monitor", "none",
		"-no-reboot",
		"-serial", "file:" + filepath.Join(v.dir, "console.log"),
		"-kernel", "/boot/vmlinuz-" + kver, "-initrd", initrd,
		"-append", fmt.Sprintf("console=ttyS0 panic=-1 quiet loglevel=4 rdinit=/init softrnic.share=%s softrnic.cache=%s %s",
			v.share, v.cfg.RootCache, kernelArgs),
		"-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
		"-virtfs", "local,path=" + v.share + ",mount_tag=share,security_model=none,multidevs=remap",
		"-netdev", "tap,id=n0,ifname=" + tapDev + ",script=no,downscript=no",
		"-device", "virtio-net-pci,netdev=n0,mac=" + guestMAC,
		"-chardev", "socket,id=ctl,path=" + sock, // QEMU connects to our listener
		"-device", "virtio-serial-pci",
		"-device", "virtserialport,chardev=ctl,name=softrnic.ctl",
	}
	// qboot starts a -kernel guest faster than SeaBIOS
	if _, err := os.Stat("/usr/share/qemu/qboot.rom"); err == nil {
		args = append(args, "-bios", "qboot.rom")
	}
	return args
}

// startQEMU starts QEMU in the namespace (ip netns exec execs it: the pid is QEMU's) and
// reaps it in a goroutine. QEMU gets SIGKILL if the test process dies.
func (v *VM) startQEMU(args []string) error {
	logf, err := os.Create(filepath.Join(v.dir, "qemu.log"))
	if err != nil {
		return fmt.Errorf("rxevm: %w", err)
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", v.cfg.Name, qemuBin}, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// own process group: a terminal's Ctrl-C reaches the test process, which closes the VM
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := testutil.StartWithParentDeath(cmd); err != nil {
		logf.Close()
		close(v.qdone)
		return fmt.Errorf("rxevm: starting QEMU: %w", err)
	}
	v.qemu = cmd
	v.info.QEMUPid = cmd.Process.Pid
	os.WriteFile(filepath.Join(v.dir, "qemu.pid"), []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644)
	go func() {
		defer close(v.qdone)
		defer logf.Close()
		v.qerr = cmd.Wait()
	}()
	return nil
}

// accept waits for QEMU to connect to the control socket.
func (v *VM) accept(ctx context.Context) (net.Conn, error) {
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-ctx.Done():
		case <-v.qdone:
		case <-stop:
			return
		}
		v.ln.Close()
	}()
	c, err := v.ln.Accept()
	if err != nil {
		select {
		case <-v.qdone:
			return nil, fmt.Errorf("QEMU exited at start (%v)", v.qerr)
		default:
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("QEMU did not connect to the control socket: %w", ctx.Err())
		}
		return nil, fmt.Errorf("control socket: %w", err)
	}
	return c, nil
}

// send writes one line to the guest.
func (v *VM) send(line string) error {
	v.wmu.Lock()
	defer v.wmu.Unlock()
	v.conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, err := v.conn.Write([]byte(line + "\n"))
	return err
}

// readLoop reads the guest's lines until the channel closes: "log TEXT", "ready ...",
// "fail REASON", "done ID RC", "bye".
func (v *VM) readLoop() {
	defer close(v.rdone)
	sc := bufio.NewScanner(v.conn)
	sc.Buffer(make([]byte, 4096), 1<<20)
	for sc.Scan() {
		verb, rest, _ := strings.Cut(sc.Text(), " ")
		switch verb {
		case "log":
			v.logf("guest: %s", rest)
		case "ready", "fail":
			select {
			case v.ready <- sc.Text():
			default:
			}
		case "done":
			id, rcs, _ := strings.Cut(rest, " ")
			rc, err := strconv.Atoi(rcs)
			if err != nil {
				rc = -1
			}
			v.mu.Lock()
			j := v.jobs[id]
			delete(v.jobs, id)
			v.mu.Unlock()
			if j != nil {
				j.finish(rc, nil)
			}
		}
	}
	err := errors.New("rxevm: the guest's control channel closed (VM stopped)")
	v.mu.Lock()
	v.dead = err
	jobs := v.jobs
	v.jobs = nil
	v.mu.Unlock()
	for _, j := range jobs {
		j.finish(-1, err)
	}
}

// parseReady reads "ready gid_index=N active_mtu=M uptime=S".
func (v *VM) parseReady(line string) error {
	for _, f := range strings.Fields(line)[1:] {
		k, val, _ := strings.Cut(f, "=")
		var err error
		switch k {
		case "gid_index":
			v.info.GIDIndex, err = strconv.Atoi(val)
		case "active_mtu":
			v.info.ActiveMTU, err = strconv.Atoi(val)
		case "uptime":
			var s float64
			s, err = strconv.ParseFloat(val, 64)
			v.info.GuestUptime = time.Duration(s * float64(time.Second))
		}
		if err != nil {
			return fmt.Errorf("bad ready line %q: %v", line, err)
		}
	}
	return nil
}

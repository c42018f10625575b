//go:build linux

package rxevm

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// readCPIO parses a newc archive: name → (mode, data).
func readCPIO(t *testing.T, b []byte) map[string]struct {
	mode uint32
	data []byte
} {
	t.Helper()
	files := make(map[string]struct {
		mode uint32
		data []byte
	})
	pad := func(n int) int { return (n + 3) &^ 3 }
	for off := 0; ; {
		if len(b)-off < 110 || string(b[off:off+6]) != "070701" {
			t.Fatalf("bad cpio header at %d", off)
		}
		field := func(i int) int {
			v, err := strconv.ParseUint(string(b[off+6+8*i:off+14+8*i]), 16, 32)
			if err != nil {
				t.Fatal(err)
			}
			return int(v)
		}
		mode, size, namesize := uint32(field(1)), field(6), field(11)
		name := string(b[off+110 : off+110+namesize-1])
		off = pad(off + 110 + namesize)
		if name == "TRAILER!!!" {
			return files
		}
		files[name] = struct {
			mode uint32
			data []byte
		}{mode, b[off : off+size]}
		off = pad(off + size)
	}
}

func TestCPIO(t *testing.T) {
	var buf bytes.Buffer
	cw := &cpioWriter{w: &buf}
	cw.dir("bin")
	cw.file("bin/x", 0o755, []byte("12345")) // sizes not a multiple of 4
	cw.file("init", 0o755, []byte("#!/bin/sh\n"))
	cw.symlink("bin/sh", "busybox")
	cw.charDev("dev/console", 0o600, 5, 1)
	if err := cw.close(); err != nil {
		t.Fatal(err)
	}
	if buf.Len()%4 != 0 {
		t.Errorf("archive of %d bytes, not 4-aligned", buf.Len())
	}
	f := readCPIO(t, buf.Bytes())
	if len(f) != 5 {
		t.Fatalf("%d entries, want 5: %v", len(f), f)
	}
	if e := f["bin/x"]; string(e.data) != "12345" || e.mode != cpioFile|0o755 {
		t.Errorf("bin/x: %q mode %o", e.data, e.mode)
	}
	if e := f["bin/sh"]; string(e.data) != "busybox" || e.mode != cpioLink|0o777 {
		t.Errorf("bin/sh: %q mode %o", e.data, e.mode)
	}
	if e := f["bin"]; e.mode != cpioDir|0o755 {
		t.Errorf("bin: mode %o", e.mode)
	}
	// the system's cpio reads it too, where there is one
	if _, err := exec.LookPath("cpio"); err == nil {
		cmd := exec.Command("cpio", "-t", "--quiet")
		cmd.Stdin = &buf
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "bin/x\n") {
			t.Errorf("cpio -t: %v: %s", err, out)
		}
	}
}

func TestModulesDep(t *testing.T) {
	dep := `kernel/fs/9p/9p.ko: kernel/fs/fscache/fscache.ko kernel/net/9p/9pnet.ko kernel/fs/netfs/netfs.ko
kernel/net/9p/9pnet.ko:
kernel/fs/fscache/fscache.ko: kernel/fs/netfs/netfs.ko
kernel/fs/netfs/netfs.ko:
kernel/net/9p/9pnet_virtio.ko.xz: kernel/drivers/virtio/virtio_ring.ko kernel/net/9p/9pnet.ko
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/net/net-failover.ko:
`
	mods, err := parseModulesDep(strings.NewReader(dep), "/lib/modules/k")
	if err != nil {
		t.Fatal(err)
	}
	if m := mods["9pnet_virtio"]; m.path != "/lib/modules/k/kernel/net/9p/9pnet_virtio.ko.xz" {
		t.Errorf("9pnet_virtio at %q", m.path)
	}
	if _, ok := mods["net_failover"]; !ok {
		t.Errorf("net-failover.ko not found as net_failover")
	}
	got := loadOrder(mods, []string{"9p", "9pnet_virtio", "virtio_pci"}) // virtio_pci: built in
	want := []string{"netfs", "fscache", "9pnet", "9p", "virtio_ring", "9pnet_virtio"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("load order %v, want %v", got, want)
	}
}

func TestVersionLess(t *testing.T) {
	for _, c := range []struct{ a, b string }{
		{"6.1.0-9-amd64", "6.1.0-56-amd64"},
		{"6.1.0-56-amd64", "6.12.0-1-amd64"},
		{"5.10.0-30-amd64", "6.1.0-1-amd64"},
	} {
		if !versionLess(c.a, c.b) || versionLess(c.b, c.a) {
			t.Errorf("want %s < %s", c.a, c.b)
		}
	}
}

func TestCounters(t *testing.T) {
	c, err := parseCounters("sent_pkts:12\nrcvd_pkts:10\nduplicate_request:0\n")
	if err != nil {
		t.Fatal(err)
	}
	if c["sent_pkts"] != 12 || c["rcvd_pkts"] != 10 || len(c) != 3 {
		t.Errorf("parsed %v", c)
	}
	d := Counters{"sent_pkts": 20, "rcvd_pkts": 10, "new": 1}.Sub(c)
	if d["sent_pkts"] != 8 || d["rcvd_pkts"] != 0 || d["new"] != 1 {
		t.Errorf("Sub: %v", d)
	}
	if s := d.String(); s != "{new=1 sent_pkts=8}" {
		t.Errorf("String: %s", s)
	}
	for _, bad := range []string{"", "x", "x:y", "x:-1"} {
		if _, err := parseCounters(bad); err == nil {
			t.Errorf("parseCounters(%q) gave no error", bad)
		}
	}
}

func TestConfig(t *testing.T) {
	c := Config{}.withDefaults()
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	if c.Name != DefaultName || c.MTU != 1500 || c.RootCache != "loose" {
		t.Errorf("defaults: %+v", c)
	}
	for _, bad := range []Config{
		{Name: "a b"}, {Name: "../x"}, {MTU: 100}, {MTU: 9001}, {Accel: "hvf"},
		{RootCache: "mmap"}, {WorkDir: "rel"}, {WorkDir: "/a b"}, {WorkDir: "/" + strings.Repeat("x", 100)},
	} {
		if err := bad.withDefaults().validate(); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}

// setLockDir points lockDir at dir and returns the function that restores it.
func setLockDir(dir string) func() {
	old := lockDir
	lockDir = dir
	return func() { lockDir = old }
}

// Locks: Slots hands out the free names in order, then waits for the first.
func TestLockSlot(t *testing.T) {
	defer setLockDir(t.TempDir())()
	cfg := Config{Name: "n", Slots: 3, WorkDir: t.TempDir()}
	var names []string
	for range 3 {
		f, slot, err := lockSlot(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		names = append(names, slotName(cfg.Name, slot))
	}
	if want := []string{"n", "n-2", "n-3"}; !reflect.DeepEqual(names, want) {
		t.Errorf("names %v, want %v", names, want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var waited string
	cfg.Logf = func(format string, args ...any) { waited = fmt.Sprintf(format, args...) }
	if _, _, err := lockSlot(ctx, cfg); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("all slots taken: err %v, want DeadlineExceeded", err)
	}
	if !strings.Contains(waited, fmt.Sprintf("waiting for pid %d", os.Getpid())) {
		t.Errorf("no word of the wait: %q", waited)
	}
}

// Available's error names what is missing and how to install it.
func TestAvailable(t *testing.T) {
	err := Available()
	t.Logf("Available: %v", err)
	var me *MissingError
	if err != nil && (!errors.As(err, &me) || !strings.Contains(err.Error(), AptInstall)) {
		t.Errorf("error %q is not a MissingError with the apt-get line", err)
	}
	err = CheckTools("sh", "no-such-tool-rxevm", "ib_write_bw_no")
	if err == nil || !strings.Contains(err.Error(), "no-such-tool-rxevm (package unknown to rxevm)") {
		t.Errorf("CheckTools: %v", err)
	}
}

// The guest scripts parse (dash for guest-init.sh, busybox sh for the initramfs's init).
func TestGuestScriptsParse(t *testing.T) {
	for _, c := range []struct {
		shell []string
		name  string
		text  []byte
	}{
		{[]string{"sh", "-n"}, "guest-init.sh", guestInit},
		{[]string{busyboxPath, "sh", "-n"}, "initramfs-init", initramfsInit},
	} {
		if _, err := exec.LookPath(c.shell[0]); err != nil {
			t.Logf("no %s: %s not checked", c.shell[0], c.name)
			continue
		}
		f := filepath.Join(t.TempDir(), c.name)
		if err := os.WriteFile(f, c.text, 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(c.shell[0], append(c.shell[1:], f)...).CombinedOutput(); err != nil {
			t.Errorf("%s %s: %v: %s", strings.Join(c.shell, " "), c.name, err, out)
		}
	}
}

// The initramfs holds busybox, /init, /dev/console and the modules in load order.
func TestBuildInitramfs(t *testing.T) {
	kver, err := pickKernel("")
	if err != nil {
		t.Skip(err)
	}
	if staticELF(busyboxPath) != nil {
		t.Skip("no static busybox")
	}
	dir := t.TempDir()
	p, err := buildInitramfs(dir, kver)
	if err != nil {
		t.Fatal(err)
	}
	if p2, err := buildInitramfs(dir, kver); err != nil || p2 != p {
		t.Errorf("second build: %q %v, want the cached %q", p2, err, p)
	}
	z, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(z))
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	f := readCPIO(t, b)
	t.Logf("%s: %d KiB compressed, %d entries, modules: %s", filepath.Base(p), len(z)>>10, len(f),
		strings.ReplaceAll(string(f["lib/modules/load.order"].data), "\n", " "))
	for _, n := range []string{"init", "bin/busybox", "bin/sh", "dev/console", "lib/modules/load.order"} {
		if _, ok := f[n]; !ok {
			t.Errorf("no %s in the initramfs", n)
		}
	}
	for _, m := range strings.Fields(string(f["lib/modules/load.order"].data)) {
		if e, ok := f["lib/modules/"+m+".ko"]; !ok || !bytes.HasPrefix(e.data, []byte("\x7fELF")) {
			t.Errorf("module %s missing or not an ELF file", m)
		}
	}
}

// A QEMU left by a crashed run (here a stand-in process whose command line looks like one
// of a VM directory's) is killed by the next Start's cleanup, for its own name and for
// another of its slots that no VM holds (but not for a slot whose lock is held); a process
// that is not such a QEMU is left alone.
func TestCleanupStaleQEMU(t *testing.T) {
	work := t.TempDir()
	defer setLockDir(t.TempDir())()
	name := "softrnic-interop-test-stale"
	v := &VM{cfg: Config{Name: name, WorkDir: work, Slots: 3}, slot: 1, dir: filepath.Join(work, name)}
	for i := 1; i <= 3; i++ {
		if netnsExists(slotName(name, i)) {
			t.Skipf("namespace %s exists", slotName(name, i))
		}
	}
	start := func(argv0, dir string) *exec.Cmd {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		// sh says it runs (so it has exec'd: its command line is argv0's), then reads its
		// stdin, a pipe nobody writes: it runs until killed
		cmd := &exec.Cmd{Path: "/bin/sh", Args: []string{argv0, "-c", "echo up; read x", dir + "/console.log"}}
		if _, err := cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if _, err := out.Read(make([]byte, 3)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill() })
		os.WriteFile(filepath.Join(dir, "qemu.pid"), []byte(fmt.Sprint(cmd.Process.Pid)), 0o644)
		return cmd
	}
	alive := func(cmd *exec.Cmd) bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", cmd.Process.Pid))
		return err == nil && len(b) > 0 // a zombie has an empty command line
	}
	other := start("not-qemu", v.dir)
	if _, ok := ownQEMU(filepath.Join(v.dir, "qemu.pid"), v.dir); ok {
		t.Fatal("a process that is not QEMU taken for the VM's QEMU")
	}
	own := start("/usr/bin/"+qemuBin, v.dir)                       // the VM's own name
	free := start(qemuBin, filepath.Join(work, slotName(name, 2))) // slot 2: free
	held := start(qemuBin, filepath.Join(work, slotName(name, 3))) // slot 3: in use
	lock, _, err := tryLock(lockPath(slotName(name, 3)))
	if err != nil || lock == nil {
		t.Fatalf("locking slot 3: %v", err)
	}
	defer lock.Close()
	if _, ok := ownQEMU(filepath.Join(v.dir, "qemu.pid"), v.dir); !ok {
		t.Fatal("the stand-in QEMU is not recognized")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := v.cleanupStale(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what string
		cmd  *exec.Cmd
		live bool
	}{{"the VM's stale QEMU", own, false}, {"a free slot's stale QEMU", free, false},
		{"the QEMU of a slot in use", held, true}, {"a process that is not QEMU", other, true}} {
		if alive(c.cmd) != c.live {
			t.Errorf("%s: alive %v, want %v", c.what, !c.live, c.live)
		}
	}
	if _, err := os.Stat(v.dir); !os.IsNotExist(err) {
		t.Errorf("VM directory left: %v", err)
	}
}

// Start cancelled during the boot cleans up: no namespace, no QEMU, the lock free.
func TestStartCancelled(t *testing.T) {
	if err := Available(); err != nil {
		t.Skip(err)
	}
	name := "softrnic-interop-test-cancel"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := Config{Name: name, WorkDir: t.TempDir(), Logf: func(format string, args ...any) {
		if strings.Contains(fmt.Sprintf(format, args...), "booting") {
			cancel() // QEMU is about to start
		}
	}}
	vm, err := Start(ctx, cfg)
	if err == nil {
		vm.Close()
		t.Fatal("Start succeeded with its context cancelled")
	}
	t.Logf("Start: %.200s", err)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("error does not wrap context.Canceled")
	}
	if netnsExists(name) {
		t.Errorf("namespace %s left behind", name)
	}
	dir := filepath.Join(cfg.withDefaults().WorkDir, name)
	if pid, ok := ownQEMU(filepath.Join(dir, "qemu.pid"), dir); ok {
		t.Errorf("QEMU pid %d left running", pid)
	}
	lock, err := lockFile(context.Background(), lockPath(name), nil)
	if err != nil {
		t.Fatal(err)
	}
	lock.Close()
}

//go:build linux

package rxevm

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

//go:embed guest/initramfs-init
var initramfsInit []byte

// initramfsVersion changes when the layout built here changes (so the cache key does).
const initramfsVersion = "1"

// initramfsModules are loaded by the initramfs, with their dependencies: PCI virtio, the
// 9p filesystem over virtio, overlayfs, the NIC and the virtio-serial control port.
var initramfsModules = []string{"virtio_pci", "9pnet_virtio", "9p", "overlay", "virtio_net", "virtio_console"}

const busyboxPath = "/bin/busybox"

// pickKernel returns want if given (checking it), else the newest kernel version that has
// a /boot/vmlinuz-<version> and an rdma_rxe module in /lib/modules/<version>.
func pickKernel(want string) (string, error) {
	if want != "" {
		if !kernelUsable(want) {
			return "", fmt.Errorf("rxevm: kernel %s: no /boot/vmlinuz-%[1]s with rdma_rxe in /lib/modules/%[1]s", want)
		}
		return want, nil
	}
	files, _ := filepath.Glob("/boot/vmlinuz-*")
	var found []string
	for _, f := range files {
		if k := strings.TrimPrefix(filepath.Base(f), "vmlinuz-"); kernelUsable(k) {
			found = append(found, k)
		}
	}
	if len(found) == 0 {
		return "", fmt.Errorf("rxevm: no /boot/vmlinuz-* with an rdma_rxe module under /lib/modules (apt-get install linux-image-amd64)")
	}
	sort.Slice(found, func(a, b int) bool { return versionLess(found[a], found[b]) })
	return found[len(found)-1], nil
}

func kernelUsable(kver string) bool {
	if _, err := os.Stat("/boot/vmlinuz-" + kver); err != nil {
		return false
	}
	deps, err := readModulesDep(kver)
	if err != nil {
		return false
	}
	_, ok := deps["rdma_rxe"]
	return ok
}

// versionLess orders kernel versions by their numbers ("6.1.0-9" < "6.1.0-56").
func versionLess(a, b string) bool {
	na, nb := versionNumbers(a), versionNumbers(b)
	for i := 0; i < len(na) && i < len(nb); i++ {
		if na[i] != nb[i] {
			return na[i] < nb[i]
		}
	}
	if len(na) != len(nb) {
		return len(na) < len(nb)
	}
	return a < b
}

func versionNumbers(s string) []int {
	var ns []int
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r < '0' || r > '9' }) {
		n, _ := strconv.Atoi(f)
		ns = append(ns, n)
	}
	return ns
}

// module is one line of modules.dep: a module file and the files it depends on.
type module struct {
	path string   // absolute
	deps []string // module names
}

// modName is a module's name from its file name: "9pnet_virtio.ko.xz" → "9pnet_virtio"
// (with '-' read as '_', as the kernel does).
func modName(file string) string {
	base := filepath.Base(file)
	if i := strings.Index(base, ".ko"); i >= 0 {
		base = base[:i]
	}
	return strings.ReplaceAll(base, "-", "_")
}

func readModulesDep(kver string) (map[string]module, error) {
	dir := filepath.Join("/lib/modules", kver)
	f, err := os.Open(filepath.Join(dir, "modules.dep"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseModulesDep(f, dir)
}

func parseModulesDep(r io.Reader, dir string) (map[string]module, error) {
	mods := make(map[string]module)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		file, deps, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		m := module{path: file}
		if !filepath.IsAbs(file) {
			m.path = filepath.Join(dir, file)
		}
		for _, d := range strings.Fields(deps) {
			m.deps = append(m.deps, modName(d))
		}
		mods[modName(file)] = m
	}
	return mods, sc.Err()
}

// loadOrder returns the modules for names with their dependencies, dependencies first,
// each once. Names not in mods are taken to be built into the kernel.
func loadOrder(mods map[string]module, names []string) []string {
	var order []string
	seen := make(map[string]bool)
	var visit func(string)
	visit = func(n string) {
		n = strings.ReplaceAll(n, "-", "_")
		if seen[n] {
			return
		}
		seen[n] = true
		m, ok := mods[n]
		if !ok {
			return // built in
		}
		for _, d := range m.deps {
			visit(d)
		}
		order = append(order, n)
	}
	for _, n := range names {
		visit(n)
	}
	return order
}

// readModule returns a module file's contents, uncompressed (busybox insmod loads plain
// .ko files only).
func readModule(path string) ([]byte, error) {
	var tool string
	switch {
	case strings.HasSuffix(path, ".ko"):
		return os.ReadFile(path)
	case strings.HasSuffix(path, ".ko.gz"):
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return io.ReadAll(zr)
	case strings.HasSuffix(path, ".ko.xz"):
		tool = "xz"
	case strings.HasSuffix(path, ".ko.zst"):
		tool = "zstd"
	default:
		return nil, fmt.Errorf("unknown module format: %s", path)
	}
	out, err := exec.Command(tool, "-dc", path).Output()
	if err != nil {
		return nil, fmt.Errorf("%s -dc %s: %w", tool, path, err)
	}
	return out, nil
}

// buildInitramfs returns the path of the initramfs for kver in workDir, building it if no
// file with the same inputs is there. The name holds a hash of everything that goes in it
// (the init script, busybox, the modules), so a change of any of them builds a new one.
func buildInitramfs(workDir, kver string) (string, error) {
	mods, err := readModulesDep(kver)
	if err != nil {
		return "", fmt.Errorf("rxevm: modules of %s: %w", kver, err)
	}
	names := loadOrder(mods, initramfsModules)
	h := sha256.New()
	fmt.Fprintf(h, "softrnic initramfs %s\x00%s\x00", initramfsVersion, kver)
	h.Write(initramfsInit)
	busybox, err := os.ReadFile(busyboxPath)
	if err != nil {
		return "", fmt.Errorf("rxevm: %w (apt-get install busybox-static)", err)
	}
	h.Write(busybox)
	kos := make([][]byte, len(names))
	for i, n := range names {
		if kos[i], err = os.ReadFile(mods[n].path); err != nil {
			return "", fmt.Errorf("rxevm: %w", err)
		}
		fmt.Fprintf(h, "\x00%s\x00", n)
		h.Write(kos[i])
	}
	out := filepath.Join(workDir, fmt.Sprintf("initramfs-%s-%s.cpio.gz", kver, hex.EncodeToString(h.Sum(nil))[:12]))
	if fi, err := os.Stat(out); err == nil && fi.Size() > 0 {
		return out, nil
	}
	for i, n := range names { // uncompress where needed
		if !strings.HasSuffix(mods[n].path, ".ko") {
			if kos[i], err = readModule(mods[n].path); err != nil {
				return "", fmt.Errorf("rxevm: %w", err)
			}
		}
	}

	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	cw := &cpioWriter{w: zw}
	for _, d := range []string{"bin", "dev", "proc", "sys", "newroot", "host", "rw", "lib", "lib/modules"} {
		cw.dir(d)
	}
	cw.charDev("dev/console", 0o600, 5, 1) // init's stdio before devtmpfs is mounted
	cw.file("bin/busybox", 0o755, busybox)
	cw.symlink("bin/sh", "busybox")
	cw.file("init", 0o755, initramfsInit)
	for i, n := range names {
		cw.file("lib/modules/"+n+".ko", 0o644, kos[i])
	}
	cw.file("lib/modules/load.order", 0o644, []byte(strings.Join(names, "\n")+"\n"))
	cw.file("lib/modules/kver", 0o644, []byte(kver+"\n"))
	if err := cw.close(); err != nil {
		return "", err
	}
	if err := zw.Close(); err != nil {
		return "", err
	}
	// older builds for this kernel are of no use any more
	old, _ := filepath.Glob(filepath.Join(workDir, "initramfs-"+kver+"-*.cpio.gz"))
	for _, o := range old {
		os.Remove(o)
	}
	tmp := fmt.Sprintf("%s.%d.tmp", out, os.Getpid())
	if err := os.WriteFile(tmp, buf.Bytes(), 0o644); err != nil {
		return "", fmt.Errorf("rxevm: %w", err)
	}
	if err := os.Rename(tmp, out); err != nil {
		return "", fmt.Errorf("rxevm: %w", err)
	}
	return out, nil
}

// cpioWriter writes a cpio archive in the "newc" format the kernel unpacks as initramfs.
type cpioWriter struct {
	w   io.Writer
	ino int
	err error
}

const (
	cpioDir  = 0o040000
	cpioFile = 0o100000
	cpioLink = 0o120000
	cpioChr  = 0o020000
)

func (c *cpioWriter) entry(name string, mode uint32, data []byte, rmajor, rminor int) {
	if c.err != nil {
		return
	}
	c.ino++
	nlink := 1
	if mode&0o170000 == cpioDir {
		nlink = 2
	}
	// magic, then 13 fields of 8 hex digits: ino mode uid gid nlink mtime filesize
	// devmajor devminor rdevmajor rdevminor namesize check
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rmajor, rminor, len(name)+1, 0)
	var b bytes.Buffer
	b.WriteString(hdr)
	b.WriteString(name)
	b.WriteByte(0)
	for b.Len()%4 != 0 {
		b.WriteByte(0)
	}
	b.Write(data)
	for n := len(data); n%4 != 0; n++ {
		b.WriteByte(0)
	}
	_, c.err = c.w.Write(b.Bytes())
}

func (c *cpioWriter) dir(name string) { c.entry(name, cpioDir|0o755, nil, 0, 0) }
func (c *cpioWriter) file(name string, perm uint32, data []byte) {
	c.entry(name, cpioFile|perm, data, 0, 0)
}
func (c *cpioWriter) symlink(name, target string) {
	c.entry(name, cpioLink|0o777, []byte(target), 0, 0)
}
func (c *cpioWriter) charDev(name string, perm uint32, major, minor int) {
	c.entry(name, cpioChr|perm, nil, major, minor)
}

func (c *cpioWriter) close() error {
	c.entry("TRAILER!!!", 0, nil, 0, 0)
	return c.err
}

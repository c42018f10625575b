//go:build linux

package rxevm

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// AptInstall is the command that installs everything the VM and the interop tests need on
// Debian 12.
const AptInstall = "apt-get install -y qemu-system-x86 linux-image-amd64 rdma-core ibverbs-utils ibverbs-providers perftest rdmacm-utils busybox-static iproute2 kmod cpio"

// MissingError lists what the VM needs and does not find.
type MissingError struct {
	Missing []string // each "what (package)" or a requirement
}

func (e *MissingError) Error() string {
	return "rxevm: cannot run the rxe VM here; missing: " + strings.Join(e.Missing, "; ") +
		". Install the packages with: " + AptInstall + " (and run as root)"
}

// toolPackages says which Debian package has each program the VM or the tests use.
var toolPackages = map[string]string{
	qemuBin:            "qemu-system-x86",
	"ip":               "iproute2",
	"rdma":             "iproute2",
	"modprobe":         "kmod",
	"setsid":           "util-linux",
	"ibv_devinfo":      "ibverbs-utils",
	"ibv_rc_pingpong":  "ibverbs-utils",
	"ibv_ud_pingpong":  "ibverbs-utils",
	"ibv_srq_pingpong": "ibverbs-utils",
	"rping":            "rdmacm-utils",
	"ucmatose":         "rdmacm-utils",
	"udaddy":           "rdmacm-utils",
	"rdma_server":      "rdmacm-utils",
	"rdma_client":      "rdmacm-utils",
	"ib_write_bw":      "perftest",
	"ib_write_lat":     "perftest",
	"ib_read_bw":       "perftest",
	"ib_read_lat":      "perftest",
	"ib_send_bw":       "perftest",
	"ib_send_lat":      "perftest",
	"ib_atomic_bw":     "perftest",
	"tcpdump":          "tcpdump",
}

// Available returns nil when this machine can run the VM: root with CAP_NET_ADMIN and
// CAP_SYS_ADMIN, /dev/net/tun, qemu-system-x86_64, a /boot/vmlinuz-* with an rdma_rxe
// module, a static /bin/busybox, ip and rdma (iproute2), modprobe (kmod), ibv_devinfo and
// the rxe provider of libibverbs. Otherwise it returns a *MissingError that names each
// missing piece and the apt-get line that installs them.
func Available() error {
	var missing []string
	if os.Geteuid() != 0 || !hasCaps(12, 21) { // CAP_NET_ADMIN, CAP_SYS_ADMIN
		missing = append(missing, "root (CAP_NET_ADMIN and CAP_SYS_ADMIN: the network namespace and tap)")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		missing = append(missing, "/dev/net/tun (the tun driver; in a container: --device /dev/net/tun)")
	}
	for _, t := range []string{qemuBin, "ip", "rdma", "modprobe", "setsid", "ibv_devinfo"} {
		if _, err := exec.LookPath(t); err != nil {
			missing = append(missing, fmt.Sprintf("%s (%s)", t, toolPackages[t]))
		}
	}
	if _, err := pickKernel(""); err != nil {
		missing = append(missing, "a /boot/vmlinuz-* with an rdma_rxe module under /lib/modules (linux-image-amd64)")
	}
	if err := staticELF(busyboxPath); err != nil {
		missing = append(missing, fmt.Sprintf("a static %s (busybox-static): %v", busyboxPath, err))
	}
	if p, _ := filepath.Glob("/usr/lib/*/libibverbs/librxe-rdmav*.so"); len(p) == 0 {
		if p, _ = filepath.Glob("/usr/lib*/libibverbs/librxe-rdmav*.so"); len(p) == 0 {
			missing = append(missing, "libibverbs' rxe provider librxe-rdmav*.so (ibverbs-providers)")
		}
	}
	if len(missing) > 0 {
		return &MissingError{Missing: missing}
	}
	return nil
}

// CheckTools returns a *MissingError naming the programs (and their packages) that are
// not installed, for tests that need more than Available checks (rping, ib_write_bw, ...).
func CheckTools(names ...string) error {
	var missing []string
	for _, t := range names {
		if _, err := exec.LookPath(t); err != nil {
			pkg := toolPackages[t]
			if pkg == "" {
				pkg = "package unknown to rxevm"
			}
			missing = append(missing, fmt.Sprintf("%s (%s)", t, pkg))
		}
	}
	if len(missing) > 0 {
		return &MissingError{Missing: missing}
	}
	return nil
}

// hasCaps reports whether the process has the given capabilities in its effective set.
func hasCaps(bits ...uint) bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			eff, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				return false
			}
			for _, bit := range bits {
				if eff&(1<<bit) == 0 {
					return false
				}
			}
			return true
		}
	}
	return false
}

// staticELF returns nil if path is an ELF executable without a program interpreter.
func staticELF(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("dynamically linked")
		}
	}
	return nil
}

//go:build linux

package rxevm

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/softrnic/softrnic/internal/testutil"
)

// pickAccel returns QEMU's accelerator and CPU model. "auto" probes once per kernel
// whether the guest kernel starts under KVM and caches the answer in WorkDir/accel-KVER:
// a /dev/kvm may exist and still not run a stock kernel (a paravirtual-only nested KVM
// such as PVM hangs it before its first message), so opening /dev/kvm is not enough.
func pickAccel(ctx context.Context, cfg Config, kver string) (accel, cpu string, err error) {
	switch cfg.Accel {
	case "kvm":
		return "kvm", "host", nil
	case "tcg":
		return "tcg", "max", nil
	}
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return "tcg", "max", nil
	}
	f.Close()
	cache := filepath.Join(cfg.WorkDir, "accel-"+kver)
	if b, err := os.ReadFile(cache); err == nil {
		if a, c, ok := strings.Cut(strings.TrimSpace(string(b)), " "); ok && (a == "kvm" || a == "tcg") {
			return a, c, nil
		}
	}
	accel, cpu = "tcg", "max"
	for _, c := range []string{"host", "host,-arch-capabilities"} {
		ok, retry := probeKVM(ctx, kver, c)
		if ok {
			accel, cpu = "kvm", c
			break
		}
		if !retry {
			break
		}
	}
	if ctx.Err() != nil {
		return "", "", fmt.Errorf("rxevm: probing KVM: %w", ctx.Err())
	}
	os.WriteFile(cache, []byte(accel+" "+cpu+"\n"), 0o644)
	return accel, cpu, nil
}

// probeKVM boots the kernel alone under KVM with -cpu cpu and reports whether it printed
// its banner within 15 s; retry says whether another CPU model is worth a try (QEMU could
// not set an MSR that the host KVM lacks).
func probeKVM(ctx context.Context, kver, cpu string) (ok, retry bool) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, qemuBin, "-machine", "pc", "-accel", "kvm", "-cpu", cpu, "-m", "256",
		"-nodefaults", "-no-user-config", "-display", "none", "-vga", "none", "-monitor", "none",
		"-no-reboot", "-serial", "stdio", "-kernel", "/boot/vmlinuz-"+kver,
		"-append", "console=ttyS0 panic=-1 rdinit=/none")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return false, false
	}
	if err := testutil.StartWithParentDeath(cmd); err != nil {
		return false, false
	}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if strings.Contains(sc.Text(), "Linux version") {
			ok = true
			break
		}
	}
	cmd.Process.Kill() // our child, by its pid
	cmd.Wait()
	return ok, !ok && strings.Contains(stderr.String(), "failed to set MSR")
}

//go:build linux

package rxevm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// netnsPath is where iproute2 keeps named network namespaces.
func netnsPath(name string) string { return filepath.Join("/run/netns", name) }

func netnsExists(name string) bool {
	_, err := os.Stat(netnsPath(name))
	return err == nil
}

// runIP runs ip(8) with args, stdin as its input; the error carries its output.
func runIP(ctx context.Context, stdin string, args ...string) error {
	cmd := exec.CommandContext(ctx, "ip", args...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("rxevm: ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

func deleteNetns(ctx context.Context, name string) error {
	if !netnsExists(name) {
		return nil
	}
	return runIP(ctx, "", "netns", "del", name)
}

// netUp creates the namespace with IPv6 off, the bridge with the host address and a static
// ARP entry for the guest, and the guest's tap.
func (v *VM) netUp(ctx context.Context) error {
	ns := v.cfg.Name
	if err := runIP(ctx, "", "netns", "add", ns); err != nil {
		return err
	}
	v.netns = true
	// IPv6 off for every link made in the namespace from now on: a quiet wire.
	err := inNetns(ns, func() error {
		for _, f := range []string{"all", "default"} {
			err := os.WriteFile("/proc/sys/net/ipv6/conf/"+f+"/disable_ipv6", []byte("1\n"), 0o644)
			if err != nil && !errors.Is(err, fs.ErrNotExist) { // no IPv6 in the kernel: fine
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("rxevm: disabling IPv6 in %s: %w", ns, err)
	}
	batch := fmt.Sprintf(`link set lo up
link add name %[1]s address %[2]s type bridge stp_state 0 forward_delay 0
tuntap add dev %[3]s mode tap
link set %[3]s mtu %[4]d master %[1]s up
link set %[1]s mtu %[4]d
addr add %[5]s/%[6]d dev %[1]s
link set %[1]s up
neigh replace %[7]s lladdr %[8]s dev %[1]s nud permanent
`, bridgeDev, hostMAC, tapDev, v.cfg.MTU, HostAddr, prefixLen, GuestAddr, guestMAC)
	return runIP(ctx, batch, "-n", ns, "-batch", "-")
}

// InNamespace runs fn on an OS thread that has joined the VM's network namespace, and
// returns its error. Sockets that fn creates belong to the namespace (and keep belonging
// to it when used from other goroutines afterwards), so an in-process softrnic device
// opened inside fn binds HostAddr and talks to the guest. Goroutines that fn starts run
// in the host's namespace: create the sockets in fn itself. The thread is discarded
// afterwards.
func (v *VM) InNamespace(fn func() error) error { return inNetns(v.cfg.Name, fn) }

func inNetns(name string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: when this goroutine returns the runtime ends the thread, so no
		// other goroutine ever runs in the namespace. (New threads are not cloned from a
		// locked thread, so they do not inherit it either.)
		runtime.LockOSThread()
		f, err := os.Open(netnsPath(name))
		if err != nil {
			errc <- fmt.Errorf("rxevm: %w", err)
			return
		}
		err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
		f.Close()
		if err != nil {
			errc <- fmt.Errorf("rxevm: setns %s: %w", name, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// HostCommand returns a command that runs a host program inside the VM's network
// namespace (ip netns exec NAME name args...), where it can bind HostAddr and exchange
// RoCEv2 with the guest. The process is the program itself (ip execs it), so killing
// cmd.Process reaches it; it gets SIGKILL if the test process dies, and only then (it is
// forked from a thread that lives as long as the process).
func (v *VM) HostCommand(ctx context.Context, name string, args ...string) *HostCmd {
	return hostCommand(ctx, "ip", append([]string{"netns", "exec", v.cfg.Name, name}, args...)...)
}

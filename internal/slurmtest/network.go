//go:build linux

package slurmtest

import (
	"context"
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
	"syscall"
	"testing"
)

// nodeNetwork is where a cluster's nodes are on the network: all on this host's
// loopback address, or each in a network namespace of its own on a bridge. It says
// which addresses slurm.conf gives slurmctld and the nodes, and how a node's slurmd is
// started.
type nodeNetwork interface {
	// available says why the network cannot be built here, or nil.
	available() error
	// build makes the network of n nodes. An error wrapping errNoNetwork means that
	// this host cannot have it (not that the build went wrong).
	build(t testing.TB, n int) error
	// teardown removes what build made, all or part of it.
	teardown() error
	// ctldAddr is the address slurmctld is reached at, from the nodes and this host.
	ctldAddr() netip.Addr
	// nodeAddr is node i's address (slurm.conf's NodeAddr), from 0.
	nodeAddr(i int) netip.Addr
	// namespace is node i's network namespace, "" for this host's.
	namespace(i int) string
	// nodeCommand is the command line that runs prog with args on node i.
	nodeCommand(i int, prog string, args ...string) (string, []string)
}

// errNoNetwork marks the errors that say a network of nodes cannot be built on this
// host at all: the test is skipped, not failed (unless SOFTRNIC_SLURM=require).
var errNoNetwork = errors.New("slurmtest: no network of nodes here")

// hostNetwork puts every node on this host's loopback address, in its network
// namespace.
type hostNetwork struct{}

var loopback = netip.MustParseAddr("127.0.0.1")

func (hostNetwork) available() error            { return nil }
func (hostNetwork) build(testing.TB, int) error { return nil }
func (hostNetwork) teardown() error             { return nil }
func (hostNetwork) ctldAddr() netip.Addr        { return loopback }
func (hostNetwork) nodeAddr(int) netip.Addr     { return loopback }
func (hostNetwork) namespace(int) string        { return "" }
func (hostNetwork) nodeCommand(_ int, prog string, args ...string) (string, []string) {
	return prog, args
}

// The bridged network's subnet, and this host's address on it (slurmctld's, and the
// address srun and sbatch reach the nodes from). Node i (from 1) has the subnet's
// address i.
var (
	bridgeSubnet = netip.MustParsePrefix("10.78.0.0/24")
	bridgeAddr   = netip.MustParseAddr("10.78.0.254")
)

// maxBridgedNodes is how many nodes the subnet has room for (.1 to .253).
const maxBridgedNodes = 253

// bridgeLockPath is the file whose lock (flock) a process holds while its bridged
// network exists: there is one subnet, so one such network on the host at a time.
func bridgeLockPath() string {
	dir := "/run/lock"
	if _, err := os.Stat(dir); err != nil {
		dir = os.TempDir()
	}
	return filepath.Join(dir, "softrnic-slurmtest-net.lock")
}

// The names a bridged network gives its namespaces and links carry the process's ID:
// slurmtest-<pid>-node<i> for node i's namespace, stnbr<pid> for the bridge, and
// stn<pid>-<i> for this host's end of node i's veth pair (the node's end, in its
// namespace, is eth0). Interface names have at most 15 bytes.
var (
	leftNamespace = regexp.MustCompile(`^slurmtest-[0-9]+-node[0-9]+$`)
	leftLink      = regexp.MustCompile(`^stn(?:br[0-9]+|[0-9]+-[0-9]+)$`)
)

// bridgedNetwork puts each node in a network namespace of its own, with the address
// 10.78.0.<i>/24 on the eth0 end of a veth pair whose other end is a port of a bridge
// in this host's namespace, which has 10.78.0.254/24. IPv6 is off on every link of it
// (nothing is sent but IPv4 within the subnet, and ARP), and each namespace's loopback
// is up.
type bridgedNetwork struct {
	pid    int
	lock   *os.File   // holds the lock on bridgeLockPath while the network exists
	undo   [][]string // ip commands that remove what build made, in the order made
	nsName []string
}

func (b *bridgedNetwork) available() error {
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("%w: ip not installed (apt-get install iproute2)", errNoNetwork)
	}
	if _, err := exec.LookPath("nsenter"); err != nil {
		return fmt.Errorf("%w: nsenter not installed (apt-get install util-linux)", errNoNetwork)
	}
	return nil
}

func (b *bridgedNetwork) ctldAddr() netip.Addr { return bridgeAddr }

func (b *bridgedNetwork) nodeAddr(i int) netip.Addr {
	a := bridgeSubnet.Addr().As4()
	a[3] = byte(i + 1)
	return netip.AddrFrom4(a)
}

func (b *bridgedNetwork) namespace(i int) string { return b.nsName[i] }

// nodeCommand runs prog in node i's network namespace through nsenter, which joins it
// and execs prog (so that the process started is prog's, and its parent-death signal
// holds). Not through ip netns exec: that also gives prog a mount namespace of its own
// with a /sys of the network namespace's, where the cgroup file systems that slurmd
// needs are not mounted.
func (b *bridgedNetwork) nodeCommand(i int, prog string, args ...string) (string, []string) {
	return "nsenter", append([]string{"--net=" + filepath.Join("/run/netns", b.nsName[i]), prog}, args...)
}

func (b *bridgedNetwork) bridge() string       { return "stnbr" + strconv.Itoa(b.pid) }
func (b *bridgedNetwork) hostEnd(i int) string { return fmt.Sprintf("stn%d-%d", b.pid, i+1) }

// build takes the subnet (waiting while another process's network holds it), removes
// what a killed test process may have left of its own, and makes the bridge, then each
// node's namespace and link.
func (b *bridgedNetwork) build(t testing.TB, n int) error {
	if n > maxBridgedNodes {
		return fmt.Errorf("slurmtest: %d nodes: the subnet %v has room for %d", n, bridgeSubnet, maxBridgedNodes)
	}
	ctx, cancel := context.WithTimeout(context.Background(), bootLimit)
	defer cancel()
	b.pid = os.Getpid()
	if err := b.takeSubnet(t); err != nil {
		return err
	}
	if err := b.removeLeftovers(ctx); err != nil {
		return err
	}
	if err := subnetUnused(); err != nil {
		return err
	}

	br := b.bridge()
	if err := ip(ctx, "link", "add", br, "type", "bridge"); err != nil {
		return fmt.Errorf("%w: %v", errNoNetwork, err)
	}
	b.undo = append(b.undo, []string{"link", "del", br})
	if err := disableIPv6(br); err != nil {
		return err
	}
	if err := ip(ctx, "addr", "add", prefixed(bridgeAddr), "dev", br); err != nil {
		return err
	}
	if err := ip(ctx, "link", "set", br, "up"); err != nil {
		return err
	}
	for i := range n {
		ns, end := "slurmtest-"+strconv.Itoa(b.pid)+"-node"+strconv.Itoa(i+1), b.hostEnd(i)
		if err := ip(ctx, "netns", "add", ns); err != nil {
			return err
		}
		b.nsName = append(b.nsName, ns)
		b.undo = append(b.undo, []string{"netns", "del", ns})
		// IPv6 off for the links made in the namespace from now on, and its loopback.
		if err := ip(ctx, "netns", "exec", ns, "sh", "-c",
			`[ ! -d /proc/sys/net/ipv6 ] || { echo 1 >/proc/sys/net/ipv6/conf/default/disable_ipv6 && echo 1 >/proc/sys/net/ipv6/conf/all/disable_ipv6; }`); err != nil {
			return err
		}
		if err := ip(ctx, "link", "add", end, "type", "veth", "peer", "name", "eth0", "netns", ns); err != nil {
			return err
		}
		b.undo = append(b.undo, []string{"link", "del", end})
		if err := disableIPv6(end); err != nil {
			return err
		}
		for _, args := range [][]string{
			{"link", "set", end, "master", br, "up"},
			{"-n", ns, "addr", "add", prefixed(b.nodeAddr(i)), "dev", "eth0"},
			{"-n", ns, "link", "set", "eth0", "up"},
			{"-n", ns, "link", "set", "lo", "up"},
		} {
			if err := ip(ctx, args...); err != nil {
				return err
			}
		}
	}
	return nil
}

// takeSubnet locks bridgeLockPath, waiting while another process holds it.
func (b *bridgedNetwork) takeSubnet(t testing.TB) error {
	path := bridgeLockPath()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("%w: %v", errNoNetwork, err)
	}
	fd := int(f.Fd())
	err = syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		t.Logf("slurmtest: waiting for another cluster's network on %v to end (lock %s)", bridgeSubnet, path)
		for err = syscall.Flock(fd, syscall.LOCK_EX); errors.Is(err, syscall.EINTR); {
			err = syscall.Flock(fd, syscall.LOCK_EX)
		}
	}
	if err != nil {
		f.Close()
		return fmt.Errorf("slurmtest: locking %s: %v", path, err)
	}
	b.lock = f
	return nil
}

// removeLeftovers removes the namespaces (and ends the processes left in them) and the
// links of bridged networks that are no more: with the subnet's lock held, any there is
// was left by a test process killed before its cleanup.
func (b *bridgedNetwork) removeLeftovers(ctx context.Context) error {
	// The links first: a veth pair goes with its end here, at once, where a namespace
	// removed by name goes (with its end of the pair) only when its last process has.
	var errs []error
	ifs, err := net.Interfaces()
	if err != nil {
		return err
	}
	for _, i := range ifs {
		if leftLink.MatchString(i.Name) {
			errs = append(errs, ip(ctx, "link", "del", i.Name))
		}
	}
	if ents, err := os.ReadDir("/run/netns"); err == nil {
		for _, e := range ents {
			if !leftNamespace.MatchString(e.Name()) {
				continue
			}
			if out, err := exec.CommandContext(ctx, "ip", "netns", "pids", e.Name()).Output(); err == nil {
				for _, f := range strings.Fields(string(out)) {
					if pid, err := strconv.Atoi(f); err == nil {
						syscall.Kill(pid, syscall.SIGKILL)
					}
				}
			}
			errs = append(errs, ip(ctx, "netns", "del", e.Name()))
		}
	}
	return errors.Join(errs...)
}

// subnetUnused checks that no link of this host has an address in the subnet.
func subnetUnused() error {
	ifs, err := net.Interfaces()
	if err != nil {
		return err
	}
	for _, i := range ifs {
		addrs, err := i.Addrs()
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil && bridgeSubnet.Overlaps(p) {
				return fmt.Errorf("%w: %s has %v, in the cluster's subnet %v", errNoNetwork, i.Name, p, bridgeSubnet)
			}
		}
	}
	return nil
}

// teardown removes the links and namespaces build made, last made first, then lets
// go of the subnet. A node's veth pair goes with either end; its namespace, once
// removed by name, when its last process ends (the cluster's are killed before).
func (b *bridgedNetwork) teardown() error {
	ctx, cancel := context.WithTimeout(context.Background(), stopLimit)
	defer cancel()
	var errs []error
	for i := len(b.undo) - 1; i >= 0; i-- {
		errs = append(errs, ip(ctx, b.undo[i]...))
	}
	b.undo = nil
	if b.lock != nil {
		errs = append(errs, b.lock.Close())
		b.lock = nil
	}
	return errors.Join(errs...)
}

// ip runs ip with args.
func ip(ctx context.Context, args ...string) error {
	if out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("slurmtest: ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// disableIPv6 turns IPv6 off on this host's link (if the kernel has IPv6).
func disableIPv6(link string) error {
	err := os.WriteFile("/proc/sys/net/ipv6/conf/"+link+"/disable_ipv6", []byte("1\n"), 0)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("slurmtest: turning IPv6 off on %s: %v", link, err)
	}
	return nil
}

// prefixed is a's with the subnet's prefix length, as ip addr add takes it.
func prefixed(a netip.Addr) string {
	return netip.PrefixFrom(a, bridgeSubnet.Bits()).String()
}

// Package netio is softrnic's UDP I/O layer: one socket per device, batched receive with
// recvmmsg (and UDP GRO), batched send with sendmmsg (and UDP GSO, one send of many
// equal-sized packets), and fault injection on outgoing datagrams (loss, reordering,
// duplication, corruption) for testing loss recovery without kernel netem.
//
// The hot paths use the socket's file descriptor directly with non-blocking system calls
// and preallocated message headers, so they allocate nothing and hold no lock across a
// system call. A small reference count keeps the descriptor valid while such calls are in
// flight; Close waits for them.
//
// The batched system calls, GSO and GRO, forced socket buffer sizes and Linux's
// don't-fragment option are Linux's (conn_linux.go, recv_linux.go, send_linux.go). Other
// systems (conn_other.go, recv_other.go, send_other.go) take the portable path, which Linux
// can be made to take too: one recvmsg per received datagram, one sendmsg per sent one,
// no GSO or GRO (GSO and GRO report false), socket buffers as large as the system allows
// without privilege, and don't-fragment where the system has a socket option for it.
// Batches, fault injection and addresses are the same on every system.
//
// On Linux a device's socket also hears when a destination's host answers a datagram with
// ICMP "port unreachable" (nothing is bound to that UDP port there: the peer device is
// not running), as TCP hears "connection refused": the socket has IP_RECVERR set, the
// kernel queues such reports on the socket's error queue, and Poll reads them and hands
// each to Config.Unreachable (unreach_linux.go). Other systems do not report ICMP errors
// to an unconnected UDP socket; there a closed port is silence, which the layers above
// notice by their timeouts.
package netio

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Config configures a Conn.
type Config struct {
	// Local is the address and port to bind. Port 0 picks an ephemeral port.
	Local netip.AddrPort
	// SocketBuffer is the requested SO_RCVBUF and SO_SNDBUF in bytes (default 32 MiB).
	// Without CAP_NET_ADMIN Linux caps it at net.core.rmem_max / wmem_max; other systems
	// get the largest size up to it that they accept (kern.ipc.maxsockbuf bounds it).
	SocketBuffer int
	// DisableGSO and DisableGRO turn off UDP segmentation offload on send and receive
	// coalescing.
	DisableGSO, DisableGRO bool
	// Faults, if any field is non-zero, are applied to every outgoing datagram.
	Faults Faults
	// FaultFilter, if set, decides the fate of each outgoing datagram exactly (for
	// deterministic tests). It runs before the random faults.
	FaultFilter FilterFunc
	// SegmentID, if set, is called for every IPv4 datagram that goes out as segment seg
	// (1, 2, ...) of a GSO send, on a copy of its last 4 bytes (which then go out instead):
	// the kernel gives segment seg the IPv4 identification base+seg (base 0: unconnected
	// socket, DF set), and a RoCEv2 datagram's ICRC covers it. length is the datagram's
	// UDP payload length.
	SegmentID func(last4 []byte, length int, seg uint16)
	// Tap, if set, is given every datagram as it leaves, after the fault injector and
	// GSO grouping: its destination, the IPv4 identification the kernel gives it (its
	// segment index in a GSO send; 0 on the portable path, where systems other than
	// Linux may give another) and its bytes, in pieces valid during the call.
	Tap func(src, dst netip.AddrPort, id uint16, pieces [][]byte)
	// SourcePorts is how many more sockets the Conn opens on its address, each with a
	// port of its own, to send from (SendBatch.BeginFrom): RoCEv2 peers take the UDP
	// source port as a flow's entropy, one per QP. They are never read.
	SourcePorts int
	// ReusePort binds with SO_REUSEPORT, so that several Conns share the address and
	// port, one per receive queue of a device (see SteerByQP).
	ReusePort bool
	// Unreachable, if set, is called by Poll for every report that a destination's host
	// answered a datagram this socket sent with ICMP port unreachable (Linux only): dst is
	// the datagram's destination and quote what the report quotes of its UDP payload
	// (Linux quotes up to 548 bytes of the IP datagram, its headers included; another host
	// may quote as little as the UDP header, leaving quote empty), valid during the call.
	// It runs in Poll's caller, which holds whatever it holds while it polls. Anyone who
	// can send this host an ICMP packet can forge a report: it is a hint to be checked
	// against what was sent, not proof.
	Unreachable func(dst netip.AddrPort, quote []byte)

	// sendOnly marks the sockets SourcePorts opens, which are never read: they do not ask
	// for ICMP reports, which would only fill their error queues.
	sendOnly bool
	// portable makes Linux take the portable path that other systems take (one recvmsg
	// or sendmsg per datagram, no GSO or GRO), so that its tests run there too. The
	// socket options stay Linux's.
	portable bool
}

// Conn is a UDP socket bound to one address, used by one softrnic device.
type Conn struct {
	uc     *net.UDPConn
	rc     syscall.RawConn
	fd     int
	local  netip.AddrPort
	v6     bool
	mmsg   bool // recvmmsg and sendmmsg (Linux); otherwise one recvmsg or sendmsg per datagram
	gso    bool
	gro    bool
	rcvbuf int
	sndbuf int

	users  atomic.Int64 // raw-fd system calls in flight
	closed atomic.Bool

	// ICMP reports (unreach_linux.go): recverr says the socket asks for them (IP_RECVERR);
	// errq that one may wait in its error queue that a receive did not find (a send, or
	// a peek, took the error the kernel sets with it); errMu guards the error queue's
	// buffers.
	unreachable    func(dst netip.AddrPort, quote []byte)
	recverr        bool
	errq           atomic.Bool
	errMu          sync.Mutex
	errBuf, errOOB []byte

	faults *injector
	segID  func(last4 []byte, length int, seg uint16)
	tap    func(src, dst netip.AddrPort, id uint16, pieces [][]byte)
	srcs   []*Conn // the sockets SourcePorts opened: sources 1, 2, ...

	// Counters.
	SendCalls    atomic.Uint64 // sendmmsg system calls (portable path: sendmsg calls)
	SendErrors   atomic.Uint64 // datagrams the kernel refused
	RecvCalls    atomic.Uint64 // recvmmsg system calls (portable path: Polls) that returned data
	RecvTrunc    atomic.Uint64 // datagrams truncated by a too small buffer
	GSOSends     atomic.Uint64 // messages sent as one GSO super-datagram
	WriteBlocked atomic.Uint64 // sends that waited for socket buffer space (not counted on the portable path)
	// ErrorReports counts the reports read from the socket's error queue (ICMP errors,
	// Linux), PortUnreachable those of them that said a destination's port was closed.
	ErrorReports, PortUnreachable atomic.Uint64
}

// ErrClosed is returned by operations on a closed Conn.
var ErrClosed = errors.New("netio: connection closed")

// Listen opens and configures the socket.
func Listen(cfg Config) (*Conn, error) {
	if !cfg.Local.Addr().IsValid() {
		return nil, errors.New("netio: no local address")
	}
	ip := cfg.Local.Addr().Unmap()
	network := udpNetwork(ip)
	lc := net.ListenConfig{}
	if cfg.ReusePort {
		lc.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) { serr = setReusePort(int(fd)) }); err != nil {
				return err
			}
			return serr
		}
	}
	pc, err := lc.ListenPacket(context.Background(), network, netip.AddrPortFrom(ip, cfg.Local.Port()).String())
	if err != nil {
		return nil, fmt.Errorf("netio: bind %v: %w", cfg.Local, err)
	}
	uc := pc.(*net.UDPConn)
	rc, err := uc.SyscallConn()
	if err != nil {
		uc.Close()
		return nil, err
	}
	c := &Conn{uc: uc, rc: rc, v6: ip.Is6(), segID: cfg.SegmentID, tap: cfg.Tap, unreachable: cfg.Unreachable}
	c.local = uc.LocalAddr().(*net.UDPAddr).AddrPort()
	c.local = netip.AddrPortFrom(c.local.Addr().Unmap(), c.local.Port())
	bufsz := cfg.SocketBuffer
	if bufsz <= 0 {
		bufsz = 32 << 20
	}
	var serr error
	err = rc.Control(func(fd uintptr) {
		c.fd = int(fd)
		serr = c.setup(cfg, bufsz)
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		uc.Close()
		return nil, fmt.Errorf("netio: configure socket: %w", err)
	}
	for i := 0; i < cfg.SourcePorts; i++ {
		sc, err := Listen(Config{Local: netip.AddrPortFrom(ip, 0), SocketBuffer: cfg.SocketBuffer,
			DisableGSO: cfg.DisableGSO, DisableGRO: true, portable: cfg.portable, sendOnly: true})
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("netio: source port %d: %w", i+1, err)
		}
		c.srcs = append(c.srcs, sc)
	}
	if cfg.Faults.Active() || cfg.FaultFilter != nil {
		c.faults = newInjector(cfg.Faults, cfg.FaultFilter, c)
	}
	return c, nil
}

// CheckPort binds local without SO_REUSEPORT and closes the socket again, returning the
// address with the port the system chose if local's was 0. A reuse-port group is bound
// after it: with SO_REUSEPORT a bind to a port another of the user's reuse-port groups
// holds would join that group rather than fail (also for port 0, which Linux may pick
// from ports such groups hold), and the two devices would share each other's traffic.
func CheckPort(local netip.AddrPort) (netip.AddrPort, error) {
	ip := local.Addr().Unmap()
	uc, err := net.ListenUDP(udpNetwork(ip), net.UDPAddrFromAddrPort(netip.AddrPortFrom(ip, local.Port())))
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("netio: bind %v: %w", local, err)
	}
	ap := uc.LocalAddr().(*net.UDPAddr).AddrPort()
	uc.Close()
	return netip.AddrPortFrom(ip, ap.Port()), nil
}

// setReusePort lets sockets of this user share the address and port (before bind).
func setReusePort(fd int) error {
	return unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
}

// udpNetwork is the net package's network name for UDP on ip (unmapped).
func udpNetwork(ip netip.Addr) string {
	if ip.Is6() {
		return "udp6"
	}
	return "udp4"
}

// Sources returns how many sockets the Conn sends from: its own (source 0) and the
// SourcePorts more.
func (c *Conn) Sources() int { return 1 + len(c.srcs) }

// SourcePort returns the UDP port datagrams sent from source i leave from.
func (c *Conn) SourcePort(i int) uint16 {
	if i == 0 {
		return c.local.Port()
	}
	return c.srcs[i-1].local.Port()
}

// source returns the socket of source i.
func (c *Conn) source(i uint8) *Conn {
	if i == 0 {
		return c
	}
	return c.srcs[i-1]
}

// LocalAddr returns the bound address.
func (c *Conn) LocalAddr() netip.AddrPort { return c.local }

// GSO reports whether segmentation offload is in use for sends.
func (c *Conn) GSO() bool { return c.gso }

// GRO reports whether receive coalescing is enabled.
func (c *Conn) GRO() bool { return c.gro }

// SocketBuffers returns the effective receive and send buffer sizes.
func (c *Conn) SocketBuffers() (rcv, snd int) { return c.rcvbuf, c.sndbuf }

// FaultCounters returns what the fault injector did so far.
func (c *Conn) FaultCounters() FaultCounters {
	if c.faults == nil {
		return FaultCounters{}
	}
	return c.faults.counters()
}

// Close closes the socket after in-flight system calls finish. Serve returns.
func (c *Conn) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	for c.users.Load() != 0 {
		runtime.Gosched()
	}
	if c.faults != nil {
		c.faults.stop()
	}
	for _, s := range c.srcs {
		s.Close()
	}
	return c.uc.Close()
}

// acquire marks a raw-fd system call in flight; false if the Conn is closed.
func (c *Conn) acquire() bool {
	c.users.Add(1)
	if c.closed.Load() {
		c.users.Add(-1)
		return false
	}
	return true
}

func (c *Conn) release() { c.users.Add(-1) }

// Addr is a destination prepared for sendmmsg.
type Addr struct {
	AP    netip.AddrPort
	raw   unix.RawSockaddrInet6 // large enough for both families
	rawLn uint32
	v4    bool // the datagram goes out as IPv4 (also from an IPv6 socket to a mapped address)
}

// MakeAddr prepares ap as a destination for this Conn's address family.
func (c *Conn) MakeAddr(ap netip.AddrPort) (Addr, error) {
	a := Addr{AP: netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), v4: ap.Addr().Unmap().Is4()}
	ip := a.AP.Addr()
	port := ap.Port()
	if !c.v6 {
		if !ip.Is4() {
			return Addr{}, fmt.Errorf("netio: %v is not an IPv4 address (device is IPv4)", ap)
		}
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(&a.raw))
		sa.Family = unix.AF_INET
		sa.Port = htons(port)
		sa.Addr = ip.As4()
		a.rawLn = unix.SizeofSockaddrInet4
	} else {
		if ip.Is4() {
			ip = netip.AddrFrom16(ip.As16())
		}
		a.raw.Family = unix.AF_INET6
		a.raw.Port = htons(port)
		a.raw.Addr = ip.As16()
		a.rawLn = unix.SizeofSockaddrInet6
	}
	return a, nil
}

// htons converts a port between host order and the network order a sockaddr holds it in
// (its own inverse, whatever the host's byte order).
func htons(p uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], p)
	return binary.NativeEndian.Uint16(b[:])
}

// mmsghdr is struct mmsghdr from <sys/socket.h>. Like C, Go pads it to msghdr's
// alignment: 64 bytes on 64-bit systems, 32 on 32-bit ones.
type mmsghdr struct {
	hdr unix.Msghdr
	n   uint32
}

// DoorbellLen is the length of a doorbell datagram: shorter than any RoCEv2 packet.
const DoorbellLen = 8

// IsDoorbell reports whether a datagram received by a Conn bound to local is a doorbell.
func IsDoorbell(d []byte, from, local netip.AddrPort) bool {
	return len(d) <= DoorbellLen && from == local
}

// Doorbell wakes the goroutine sleeping in Serve: it sends the socket itself a datagram of
// DoorbellLen bytes, which Poll returns like any other (the receiver skips it: IsDoorbell).
// Its bytes 4-7 hold key, big-endian, where a RoCEv2 header has its destination QP, so
// that in a group steered by QP (SteerByQP) it reaches the socket that key's QPs go to.
// It bypasses fault injection: a doorbell is not a packet.
func (c *Conn) Doorbell(key uint32) {
	if !c.acquire() {
		return
	}
	defer c.release()
	var bell [DoorbellLen]byte
	binary.BigEndian.PutUint32(bell[4:], key)
	var sa unix.Sockaddr
	if c.v6 {
		sa6 := &unix.SockaddrInet6{Port: int(c.local.Port())}
		sa6.Addr = c.local.Addr().As16()
		sa = sa6
	} else {
		sa = &unix.SockaddrInet4{Port: int(c.local.Port()), Addr: c.local.Addr().As4()}
	}
	err := unix.Sendto(c.fd, bell[:], 0, sa)
	if err != nil && c.queuedSendError(err) {
		err = unix.Sendto(c.fd, bell[:], 0, sa) // the error was an ICMP report's, not the doorbell's
	}
	if err != nil {
		c.SendErrors.Add(1)
	}
}

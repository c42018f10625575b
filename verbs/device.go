package verbs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/pcap"
	"github.com/softrnic/softrnic/internal/transport"
	"github.com/softrnic/softrnic/internal/wire"
)

// DefaultPort is the RoCEv2 UDP port.
const DefaultPort = wire.UDPPort

// AnyPort in DeviceConfig.Port lets the kernel choose the device's UDP port (useful for
// tests that run in parallel).
const AnyPort = -1

// FaultsEnv is the environment variable OpenDevice reads fault injection from when
// DeviceConfig.Faults is nil, e.g. "loss=0.01,reorder=0.02,dup=0.005,corrupt=0.001,seed=7".
const FaultsEnv = "SOFTRNIC_FAULTS"

// PcapEnv names the environment variable that makes every device opened without a
// DeviceConfig.PcapFile capture its packets: its value is a directory, where each device
// writes softrnic-ADDR-PID-N.pcap (N counts the devices the process opened).
const PcapEnv = "SOFTRNIC_PCAP"

// QueuesEnv names the environment variable OpenDevice takes the number of receive queues
// from when DeviceConfig.Queues is 0 (e.g. SOFTRNIC_QUEUES=4).
const QueuesEnv = "SOFTRNIC_QUEUES"

// DefaultSourcePorts is DeviceConfig.SourcePorts when it is 0.
const DefaultSourcePorts = 4

// DefaultPcapLimit is the size a packet capture stops growing at.
const DefaultPcapLimit = 256 << 20

// Faults are probabilities applied independently to every datagram a device sends.
// Corrupted datagrams have one bit flipped; the receiver's ICRC check drops them.
type Faults struct {
	Loss    float64
	Reorder float64
	Dup     float64
	Corrupt float64
	Seed    uint64
}

// ParseFaults parses the SOFTRNIC_FAULTS syntax.
func ParseFaults(s string) (Faults, error) {
	f, err := netio.ParseFaults(s)
	return Faults(f), err
}

// DeviceConfig says which software device to open.
type DeviceConfig struct {
	// Addr is the device's IP address: its GID is this address (IPv4-mapped for IPv4).
	// The zero value means 127.0.0.1. Several devices on one host use 127.0.0.1,
	// 127.0.0.2, ...
	Addr netip.Addr
	// Port is the UDP port: 0 means 4791 (DefaultPort), AnyPort an ephemeral port.
	Port int
	// Faults injects faults into every datagram the device sends. Nil means: read
	// SOFTRNIC_FAULTS from the environment; a pointer to the zero value means none.
	Faults *Faults
	// NumCompVectors is the number of completion handlers (completion vectors) when
	// CompletionHandlers is nil (default: the number of CPUs).
	NumCompVectors int
	// CompletionHandlers configures the completion handlers one by one: each one's CPU set
	// and priority. Nil means NumCompVectors unpinned handlers of priority 0.
	CompletionHandlers []HandlerConfig
	// Window is the most unacknowledged packets a QP keeps in flight (default 1024). A
	// QP's window starts at 128 (or Window, if smaller), doubles after each stretch of 16
	// windows acknowledged without a loss, and goes back to 128 at every loss (ordered
	// mode's go-back-N resends what followed a lost packet); it opens no further than the
	// socket's receive buffer holds.
	Window int
	// SocketBuffer is the UDP socket's send and receive buffer in bytes (default 32 MiB).
	SocketBuffer int
	// DisableGSO and DisableGRO turn off UDP segmentation offload and receive coalescing.
	DisableGSO, DisableGRO bool
	// ReorderThreshold is how many later packets weak mode waits to see acknowledged
	// before it declares a packet lost (default 16).
	ReorderThreshold int
	// LossProbe is weak mode's tail-loss probe: when nothing was acknowledged for this long
	// (at least; it adapts to the measured round trip), the first missing packet is sent
	// again (default 4 ms; negative: off).
	LossProbe time.Duration
	// BusyPoll is how long the device's receive goroutine keeps polling its socket after
	// the last packet before it sleeps in the network poller (default 50 µs; negative:
	// never). Polling costs CPU while traffic flows and saves the several microseconds a
	// sleeping goroutine (and idle CPU) takes to wake for each packet.
	BusyPoll time.Duration
	// PcapFile, if set, is created and receives every packet the device sends and
	// receives, in pcap format, as a link would carry it (what ibdump or tcpdump on an rxe
	// interface show: one RoCE packet per IP datagram, its real IPv4/UDP header, GSO
	// batches cut into their segments with the identifications they get), for tshark or
	// any ICRC checker; see also PcapEnv. Off by default; nothing is done per packet when
	// off. PcapLimit bounds the file (default DefaultPcapLimit): packets past it are not
	// written.
	PcapFile  string
	PcapLimit int64
	// SourcePorts is how many more UDP sockets (ports) the device sends from: a QP
	// connected to a standard RoCEv2 peer (Endpoint.AnySourcePort) sends from one of them,
	// chosen by its QP number, as rxe and ConnectX give each QP a source port of its own
	// (flow entropy for ECMP and receive steering). Default 4; negative: none, every
	// packet leaves from the device's port. A QP connected to a softrnic peer uses the
	// device's port, which the peer checks.
	SourcePorts int
	// Queues is the number of receive queues, as a NIC has several: each a UDP socket on
	// the device's address and port (SO_REUSEPORT) with its own receive goroutine and
	// timers, the kernel steering every packet to the queue of its destination QP (a
	// classic BPF program reads the BTH's destination QP: a NIC's receive-side scaling by
	// QP). A QP lives on queue QPN mod Queues. 0: one for every two processors the process
	// runs on (GOMAXPROCS), at most 8 (transport.DefaultQueues); where the kernel cannot steer (not Linux), always 1.
	Queues int
	// Capture, if set (and PcapFile is not), is a capture the device writes to; several
	// devices may share one. The device does not close it.
	Capture *PacketCapture
	// Logger, if set, is told about the device's connection events: an RC or UD QP that
	// entered the error state on a failure of its own (its retries exhausted, a NAK from
	// the responder, a protection error; not a ModifyQP to ERR), at Warn; and, through
	// the device's connection manager (package cm), connections established and closed
	// (Info), rejected, timed out and lost with their peer (Warn). Nil: no logging. Events
	// are rare; nothing is logged per packet or per work request.
	Logger *slog.Logger

	filter netio.FilterFunc // exact per-packet faults, for this package's tests
}

// Device limits (what QueryDevice reports; all of them are enforced).
const (
	maxQP        = 65536
	maxQPWR      = 16384
	maxSGE       = 32
	maxCQ        = 65536
	maxCQE       = 1 << 20
	maxMR        = 1 << 20
	maxMRSize    = 1 << 40
	maxPD        = 1 << 20
	maxQPRdAtom  = 128
	maxSRQ       = 65536
	maxSRQWR     = 16384
	maxInline    = 400
	maxMsgSize   = transport.MaxMessage
	vendorID     = 0x5354 // "ST"
	vendorPartID = 0x0001
)

// AtomicCap says how atomics behave (ibv_atomic_cap).
type AtomicCap int

// Atomic capabilities.
const (
	AtomicNone AtomicCap = 0
	AtomicHCA  AtomicCap = 1 // atomic among operations through this device
	AtomicGlob AtomicCap = 2
)

// DeviceAttr are the device's capabilities and limits (ibv_device_attr).
type DeviceAttr struct {
	FWVer           string
	NodeGUID        uint64
	VendorID        uint32
	VendorPartID    uint32
	MaxMRSize       uint64
	MaxQP           int
	MaxQPWR         int
	MaxSGE          int
	MaxCQ           int
	MaxCQE          int
	MaxMR           int
	MaxPD           int
	MaxQPRdAtom     int // max_qp_rd_atom: responder resources per QP
	MaxQPInitRdAtom int // max_qp_init_rd_atom: outstanding READ/atomic as initiator
	MaxSRQ          int
	MaxSRQWR        int
	MaxSRQSGE       int
	AtomicCap       AtomicCap
	MaxInlineData   int
	MaxMsgSize      uint64
	NumCompVectors  int
	PhysPortCnt     int
	// NumQueues is the device's receive queues (DeviceConfig.Queues, after defaults and
	// fallback; not in libibverbs, whose devices hide their RSS queues).
	NumQueues int
}

// Device is an open software RDMA device (ibv_context).
type Device struct {
	dev  *transport.Device
	pcap *pcap.Writer // the packet capture the device opened (PcapFile, PcapEnv), if any
	attr DeviceAttr
	port PortAttr
	gid  GID

	mu     sync.Mutex
	nextPD uint32
	pds    int
	cqs    int
	mrs    int
	qps    int
	srqs   int
	closed bool
	done   chan struct{} // closed by Close: wakes every waiter
	gsi    *gsi          // QP1 and its agent (gsi.go)
	events eventQueue
	qpSet  map[*QP]struct{} // the device's QPs (guarded by mu), listed by QPs
	log    *slog.Logger     // DeviceConfig.Logger

	hs    atomic.Pointer[handlerSet] // completion handlers
	cqSet map[*CQ]struct{}           // the device's CQs (guarded by mu), to unbind a removed handler's
	// priorityWait bounds how long a handler waits for a higher-priority one to take its
	// events (yieldToHigher), in ns: 0 is maxPriorityWait, a negative value no bound (a
	// test's setting, where the order must not depend on how promptly threads run).
	priorityWait atomic.Int64
}

// ackGroup is shared by the devices of the process: a goroutine polling one of them also
// sends the ACKs the others hold back (see transport.AckGroup).
var ackGroup = transport.NewAckGroup()

// OpenDevice opens a software RDMA device: a UDP socket on cfg.Addr and cfg.Port with
// its own receive goroutine and timers.
func OpenDevice(cfg DeviceConfig) (*Device, error) {
	addr := cfg.Addr
	if !addr.IsValid() {
		addr = netip.AddrFrom4([4]byte{127, 0, 0, 1})
	}
	addr = addr.Unmap()
	port := cfg.Port
	switch {
	case port == 0:
		port = DefaultPort
	case port == AnyPort:
		port = 0
	case port < 0 || port > 65535:
		return nil, fmt.Errorf("verbs: UDP port %d out of range", cfg.Port)
	}
	var faults netio.Faults
	if cfg.Faults != nil {
		faults = netio.Faults(*cfg.Faults)
	} else if env := os.Getenv(FaultsEnv); env != "" {
		f, err := netio.ParseFaults(env)
		if err != nil {
			return nil, fmt.Errorf("verbs: %s: %w", FaultsEnv, err)
		}
		faults = f
	}
	queues := cfg.Queues
	if env := os.Getenv(QueuesEnv); queues == 0 && env != "" {
		n, err := strconv.Atoi(env)
		if err != nil || n < 1 || n > transport.MaxQueues {
			return nil, fmt.Errorf("verbs: open device: %s=%q: want a number of queues from 1 to %d", QueuesEnv, env, transport.MaxQueues)
		}
		queues = n
	}
	if queues < 0 || queues > transport.MaxQueues {
		return nil, fmt.Errorf("verbs: open device: %w: %d queues (1 to %d, or 0 for the default)", ErrInvalid, queues, transport.MaxQueues)
	}
	hcfg := cfg.CompletionHandlers
	switch {
	case hcfg == nil:
		n := cfg.NumCompVectors
		if n <= 0 {
			n = runtime.NumCPU()
		}
		hcfg = make([]HandlerConfig, n)
	case len(hcfg) == 0:
		return nil, fmt.Errorf("verbs: open device: %w: CompletionHandlers is empty (a device has at least one)", ErrInvalid)
	case cfg.NumCompVectors > 0 && cfg.NumCompVectors != len(hcfg):
		return nil, fmt.Errorf("verbs: open device: %w: NumCompVectors %d but %d CompletionHandlers", ErrInvalid, cfg.NumCompVectors, len(hcfg))
	}
	c := &Device{gid: GIDFromAddr(addr), nextPD: 1, done: make(chan struct{}), cqSet: map[*CQ]struct{}{},
		qpSet: map[*QP]struct{}{}, log: cfg.Logger}
	if err := c.setupHandlers(hcfg); err != nil {
		return nil, err
	}
	tap, err := openPcap(cfg, addr)
	if err != nil {
		c.stopHandlers()
		return nil, fmt.Errorf("verbs: open device: %w", err)
	}
	c.pcap = tap
	if tap == nil && cfg.Capture != nil {
		tap = cfg.Capture.w
	}
	srcPorts := cfg.SourcePorts
	switch {
	case srcPorts == 0:
		srcPorts = DefaultSourcePorts
	case srcPorts < 0:
		srcPorts = 0
	}
	pattr := portAttr(addr)
	d, err := transport.Open(transport.Config{
		MTU:              uint8(pattr.ActiveMTU),
		Tap:              tap,
		SourcePorts:      srcPorts,
		Queues:           queues,
		Local:            netip.AddrPortFrom(addr, uint16(port)),
		Faults:           faults,
		FaultFilter:      cfg.filter,
		AckGroup:         ackGroup,
		SocketBuffer:     cfg.SocketBuffer,
		DisableGSO:       cfg.DisableGSO,
		DisableGRO:       cfg.DisableGRO,
		MaxQP:            maxQP,
		MaxMR:            maxMR,
		Window:           cfg.Window,
		BusyPoll:         cfg.BusyPoll,
		ReorderThreshold: cfg.ReorderThreshold,
		LossProbe:        cfg.LossProbe,
	})
	if err != nil {
		c.stopHandlers()
		if c.pcap != nil {
			c.pcap.Close()
		}
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("verbs: open device: %w (another device, in this process or another, has %v: "+
				"give each device an address of its own, 127.0.0.2, 127.0.0.3, ..., or a port of its own, "+
				"or DeviceConfig.Port AnyPort to let the system choose a free one)", err, netip.AddrPortFrom(addr, uint16(port)))
		}
		return nil, fmt.Errorf("verbs: open device: %w", err)
	}
	c.dev = d
	c.port = pattr
	c.events.init()
	ip16 := addr.As16()
	c.attr = DeviceAttr{
		FWVer:           "softrnic 0.1",
		NodeGUID:        uint64(ip16[12])<<24 | uint64(ip16[13])<<16 | uint64(ip16[14])<<8 | uint64(ip16[15]) | uint64(d.LocalAddr().Port())<<32,
		VendorID:        vendorID,
		VendorPartID:    vendorPartID,
		MaxMRSize:       maxMRSize,
		MaxQP:           maxQP,
		MaxQPWR:         maxQPWR,
		MaxSGE:          maxSGE,
		MaxCQ:           maxCQ,
		MaxCQE:          maxCQE,
		MaxMR:           maxMR,
		MaxPD:           maxPD,
		MaxQPRdAtom:     maxQPRdAtom,
		MaxQPInitRdAtom: maxQPRdAtom,
		MaxSRQ:          maxSRQ,
		MaxSRQWR:        maxSRQWR,
		MaxSRQSGE:       maxSGE,
		AtomicCap:       AtomicHCA,
		MaxInlineData:   maxInline,
		MaxMsgSize:      maxMsgSize,
		NumCompVectors:  len(hcfg),
		PhysPortCnt:     1,
	}
	d.OnEvent = c.onEvent
	if c.log != nil {
		d.OnQPError = c.onQPError
	}
	if err := c.openGSI(); err != nil {
		c.Close()
		return nil, fmt.Errorf("verbs: open device: QP1: %w", err)
	}
	return c, nil
}

// Close closes the device. Its QPs stop moving packets (they are not flushed). Afterwards
// every call on the device or an object created from it returns an error wrapping
// ErrClosed (PollCQ returns no more completions; CQ.Wait returns ErrClosed), and every
// goroutine waiting in GetCQEvent, GetAsyncEvent or CQ.Wait is woken and gets ErrClosed.
func (c *Device) Close() error {
	if c.gsi != nil {
		c.gsi.closing() // the connection manager's last DisconnectRequests go out first
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.done)
	c.mu.Unlock()
	c.events.close()
	err := c.dev.Close()
	c.stopHandlers()
	if c.pcap != nil {
		if perr := c.pcap.Close(); err == nil {
			err = perr
		}
	}
	return err
}

// QueryDevice returns the device's attributes.
func (c *Device) QueryDevice() DeviceAttr {
	a := c.attr
	a.NumCompVectors = c.handlerSet().live // handlers may be added and removed
	a.NumQueues = c.dev.Queues()
	return a
}

// Addr returns the device's IP address and UDP port: where peers send to.
func (c *Device) Addr() netip.AddrPort { return c.dev.LocalAddr() }

// QueryGID returns the GID at index on port (the device has one port, 1, with one GID
// at index 0: its IP address, IPv4-mapped for IPv4).
func (c *Device) QueryGID(port uint8, index int) (GID, error) {
	if port != 1 {
		return GID{}, fmt.Errorf("%w: port %d (the device has port 1)", ErrInvalid, port)
	}
	if index != 0 {
		return GID{}, fmt.Errorf("%w: GID index %d (the device has one GID, index 0)", ErrInvalid, index)
	}
	return c.gid, nil
}

// Errors.
var (
	// ErrInvalid is wrapped by errors for invalid arguments.
	ErrInvalid = errors.New("invalid argument")
	// ErrBusy is wrapped by errors for objects that are still in use.
	ErrBusy = errors.New("resource busy")
	// ErrLimit is wrapped by errors for exceeded device limits.
	ErrLimit = errors.New("device limit reached")
	// ErrClosed is returned after the device or object was closed or destroyed.
	ErrClosed = errors.New("device or object closed")
)

func (c *Device) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

func (c *Device) check() error {
	if c.closed {
		return ErrClosed
	}
	return nil
}

// GID is a 128-bit global identifier; for RoCEv2 an IPv6 address or an IPv4-mapped one.
type GID [16]byte

// GIDFromAddr returns the GID of an IP address.
func GIDFromAddr(a netip.Addr) GID { return GID(a.As16()) }

// Addr returns the IP address the GID stands for.
func (g GID) Addr() netip.Addr { return netip.AddrFrom16(g).Unmap() }

// IsZero reports whether g is all zeros.
func (g GID) IsZero() bool { return g == GID{} }

// String formats the GID as an IP address.
func (g GID) String() string { return g.Addr().String() }

// AsyncEvent is an asynchronous event (ibv_async_event). Exactly the field for the
// object kind of Type is set.
type AsyncEvent struct {
	Type EventType
	QP   *QP
	CQ   *CQ
	SRQ  *SRQ
	// Detail says what happened, in words.
	Detail string
}

// EventType is the kind of an asynchronous event, with libibverbs' values.
type EventType int

// Asynchronous event types.
const (
	EventCQErr           EventType = EventType(transport.EventCQErr)
	EventQPFatal         EventType = EventType(transport.EventQPFatal)
	EventQPReqErr        EventType = EventType(transport.EventQPReqErr)
	EventQPAccessErr     EventType = EventType(transport.EventQPAccessErr)
	EventCommEst         EventType = EventType(transport.EventCommEst)
	EventSQDrained       EventType = EventType(transport.EventSQDrained)
	EventDeviceFatal     EventType = EventType(transport.EventDeviceFatal)
	EventSRQErr          EventType = EventType(transport.EventSRQErr)
	EventSRQLimitReached EventType = EventType(transport.EventSRQLimit)
	EventQPLastWQE       EventType = EventType(transport.EventQPLastWQE)
)

var eventNames = map[EventType]string{
	EventCQErr: "CQ error", EventQPFatal: "local work queue catastrophic error",
	EventQPReqErr: "invalid request local work queue error", EventQPAccessErr: "local access violation work queue error",
	EventCommEst: "communication established", EventSQDrained: "send queue drained",
	EventDeviceFatal: "local catastrophic error", EventSRQErr: "SRQ catastrophic error",
	EventSRQLimitReached: "SRQ limit reached", EventQPLastWQE: "last WQE reached",
}

// String returns the event's description (as ibv_event_type_str).
func (e EventType) String() string {
	if s, ok := eventNames[e]; ok {
		return s
	}
	return fmt.Sprintf("unknown event %d", int(e))
}

func (c *Device) onEvent(e transport.Event) {
	ev := &AsyncEvent{Type: EventType(e.Type), Detail: e.Detail}
	if e.QP != nil {
		if q, ok := e.QP.Owner.(*QP); ok {
			ev.QP = q
		}
	}
	if e.CQ != nil {
		if q, ok := e.CQ.Owner.(*CQ); ok {
			ev.CQ = q
		}
	}
	if e.SRQ != nil {
		if q, ok := e.SRQ.Owner.(*SRQ); ok {
			ev.SRQ = q
		}
	}
	c.events.push(ev)
	// A goroutine waiting in GetAsyncEvent should see the event now, not after the
	// receive goroutine's burst of packets: an SRQ limit event is only useful early.
	c.dev.RequestYield()
}

// GetAsyncEvent waits for the next asynchronous event. Each event must be acknowledged
// with AckAsyncEvent; destroying the object it names waits for that. A goroutine waiting
// here runs as soon as the receive goroutine has finished the batch of packets that raised
// the event (it yields its processor then), so an SRQ limit event can be acted on in time.
func (c *Device) GetAsyncEvent(ctx context.Context) (*AsyncEvent, error) {
	ev, err := c.events.get(ctx)
	if errors.Is(err, ErrClosed) {
		return nil, fmt.Errorf("verbs: GetAsyncEvent: %w", err)
	}
	return ev, err
}

// TryGetAsyncEvent returns the next asynchronous event if there is one.
func (c *Device) TryGetAsyncEvent() (*AsyncEvent, bool) { return c.events.tryGet() }

// AckAsyncEvent acknowledges an event returned by GetAsyncEvent or TryGetAsyncEvent.
func (c *Device) AckAsyncEvent(ev *AsyncEvent) { c.events.ack(ev) }

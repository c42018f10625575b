package rsocket

import (
	"fmt"
	"time"

	"github.com/softrnic/softrnic/verbs"
)

// Options are a connection's buffer and queue sizes and its transport settings, what
// rsockets' socket options (SO_RCVBUF, SO_SNDBUF, RDMA_SQSIZE, RDMA_RQSIZE, RDMA_INLINE)
// and configuration files set for a C program. Every field may be left zero.
type Options struct {
	// RecvBuffer is the receive ring in bytes (default 128 KiB, librdmacm's default;
	// a C program's SO_RCVBUF of n gives 2n, rstream's default 1 MiB). The peer is granted
	// half of it at a time, so it bounds the bytes in flight towards this side.
	RecvBuffer int
	// SendBuffer is the registered buffer that Write copies into (default 128 KiB).
	SendBuffer int
	// QueueSize is the depth of the send and receive queues (default 384, librdmacm's):
	// the data messages either side may have outstanding.
	QueueSize int
	// InlineSize is the largest message sent inline, its bytes copied into the work
	// request as it is posted (default 64, at least 16).
	InlineSize int
	// IOMapSize is how many buffers the peer may map into this side's iomap table
	// (librdmacm's RDMA_IOMAPSIZE, default 0; riostream uses 1): the peer's IOMap
	// entries, which this side's IOWrite writes into.
	IOMapSize int
	// Ordering is the ordering mode offered (verbs.OrderingWeak is used only between
	// softrnic devices that both offer it; a standard peer gets ordered mode).
	Ordering verbs.Ordering
	// ACKTimeout is how long a message waits for its acknowledgement before it is sent
	// again (the QP's local ACK timeout, rounded up to 4.096 µs × 2^n). A Dialer asks for
	// 2.1 s by default, what a C program's rconnect gets from Linux's rdma_cm on RoCE, and
	// the listener takes what the dialler asks unless its own is set. Between softrnic
	// devices on a lossy link a shorter one (tens of milliseconds) recovers a lost last
	// packet sooner; against a slow standard peer it makes both sides retransmit early.
	ACKTimeout time.Duration
	// KeepAlive is how often the connection manager probes the peer device
	// (cm.DefaultKeepAlive; negative: never).
	KeepAlive time.Duration
	// BusyPoll is how long a Read or Write that must wait polls the connection's
	// completion queue, receiving the device's packets in its own goroutine, before it
	// sleeps until a completion event (default 50 µs, DefaultBusyPoll; negative: it
	// sleeps at once). librdmacm polls the same way before it blocks (10 µs). Polling
	// saves the wake-ups of the device's receive goroutine and of the waiting goroutine,
	// which on a quiet machine are most of a small message's latency; it costs up to
	// BusyPoll of CPU time per wait that finds nothing. A polling call yields the
	// processor between polls, so goroutines with work go first, and at most GOMAXPROCS
	// calls of the process poll at once; the others sleep at once.
	BusyPoll time.Duration
	// NoDelay sends every Write's bytes at once, each as messages of their own, as
	// TCP_NODELAY does for a TCP socket's small writes. By default bytes written while an
	// earlier message is on its way wait for it (at most a millisecond, and never once
	// this side reads) and go out with what follows as one message, as Linux's TCP
	// autocorking does: fewer, larger messages when the writer is faster than the link,
	// and no wait when it is not. librdmacm sends at once.
	NoDelay bool
}

// Defaults, as librdmacm has them.
const (
	DefaultBuffer     = 128 << 10
	DefaultQueueSize  = 384
	DefaultInlineSize = 64
	// DefaultBusyPoll is Options.BusyPoll's default: 50 µs, Linux's suggested busy_poll
	// for sockets. Shorter polls miss the peer's answer to a small message (a round trip
	// is 15-40 µs between two processes here); longer ones only spend more CPU time
	// when the peer is slow.
	DefaultBusyPoll = 50 * time.Microsecond
)

// Limits of Options.
const (
	minBuffer    = 4096
	maxBuffer    = 1 << 30
	minQueueSize = 16     // librdmacm's RS_QP_MIN_SIZE
	maxQueueSize = 0x4000 // credits are 16-bit; kept well below
	maxInline    = 256
	maxIOMap     = 128 // the connect block's one byte carries up to 128 as it is
)

func (o Options) withDefaults() (Options, error) {
	if o.RecvBuffer == 0 {
		o.RecvBuffer = DefaultBuffer
	}
	if o.SendBuffer == 0 {
		o.SendBuffer = DefaultBuffer
	}
	if o.QueueSize == 0 {
		o.QueueSize = DefaultQueueSize
	}
	if o.InlineSize == 0 {
		o.InlineSize = DefaultInlineSize
	}
	if o.BusyPoll == 0 {
		o.BusyPoll = DefaultBusyPoll
	}
	switch {
	case o.RecvBuffer < minBuffer || o.RecvBuffer > maxBuffer || o.RecvBuffer%2 != 0:
		return o, fmt.Errorf("RecvBuffer %d: want an even number of bytes in %d..%d", o.RecvBuffer, minBuffer, maxBuffer)
	case o.SendBuffer < minBuffer || o.SendBuffer > maxBuffer:
		return o, fmt.Errorf("SendBuffer %d: want %d..%d bytes", o.SendBuffer, minBuffer, maxBuffer)
	case o.QueueSize < minQueueSize || o.QueueSize > maxQueueSize:
		return o, fmt.Errorf("QueueSize %d: want %d..%d", o.QueueSize, minQueueSize, maxQueueSize)
	case o.InlineSize < 0 || o.InlineSize > maxInline:
		return o, fmt.Errorf("InlineSize %d: want 0..%d", o.InlineSize, maxInline)
	case o.IOMapSize < 0 || o.IOMapSize > maxIOMap:
		return o, fmt.Errorf("IOMapSize %d: want 0..%d", o.IOMapSize, maxIOMap)
	}
	o.InlineSize = max(o.InlineSize, iomapLen) // grants and iomap entries go inline
	return o, nil
}

package rsocket

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/verbs"
)

// Conn is a stream over an RDMA connection: a net.Conn speaking librdmacm's rsocket
// protocol. Read, Write and the other methods behave as a *net.TCPConn's do: Reads and
// Writes may run concurrently with each other and with Close and the deadline setters;
// a deadline wakes a blocked call with an error that satisfies os.ErrDeadlineExceeded;
// Close wakes every blocked call, after which every call returns an error wrapping
// net.ErrClosed. Errors are *net.OpError values.
//
// Write copies into the connection's registered send buffer and returns, as a TCP Write
// returns once its bytes are in the socket buffer; ReadFrom reads straight into that
// buffer and WriteTo writes straight out of the receive ring, so io.Copy to or from a
// Conn copies each byte once. Bytes written while an earlier message is still on its
// way wait for it and go out with what follows as one message (see Options.NoDelay).
type Conn struct {
	o      Options
	cn     *cm.Conn
	pd     *verbs.PD
	ch     *verbs.CompChannel // the queue's events, which a sleeping call waits for
	cq     *verbs.CQ
	qp     *verbs.QP
	ring   *verbs.MR // the receive ring the peer writes data into
	target *verbs.MR // the grant slots the peer writes into
	sbuf   *verbs.MR // Write's buffer, then the scratch of a grant and of an iomap entry

	local, remote Addr
	peerBE        bool // the peer reads grants big-endian
	peerTarget    sge  // the peer's grant slots (its iomap table follows them)
	// peerIOMap are this side's mappings, by their index in the peer's iomap table
	// (guarded by wlock); iomaps the peer's, as it wrote them into this side's table
	// (guarded by mu).
	peerIOMap []*Mapping
	iomaps    []ioEntry
	rq        int // receive queue depth, the credits this side gives

	// Locks. rlock and wlock serialise Reads and Writes (the ring's one reader, the send
	// buffer's one writer) and are held across their waits; Close takes both, rlock
	// first, as WriteTo into the same connection does (ReadFrom from the same connection
	// would take them the other way: it is refused). ctrlMu is taken before mu, never after;
	// pollMu is only ever tried (progress), never waited for, and its holder may take
	// ctrlMu and mu, and try wlock (tryFlush: Reads and the cork timer try it too). No
	// lock is held across a wait but rlock and wlock.
	rlock sync.Mutex // serialises Reads (the receive ring's reader)
	wlock sync.Mutex // serialises Writes (the send buffer's writer)

	// The poller (progress) owns wcs and recvs.
	pollMu     sync.Mutex
	pollWanted atomic.Bool
	sleepers   atomic.Int32 // calls asleep until a completion event
	wcs        []verbs.WorkCompletion
	recvs      []verbs.RecvWR

	ctrlMu  sync.Mutex      // serialises control posts, which share ctrlWR
	ctrlWR  [1]verbs.SendWR // guarded by ctrlMu
	ctrlSGE [1]verbs.SGE    // guarded by ctrlMu
	dataWR  [1]verbs.SendWR // guarded by wlock
	dataSGE [1]verbs.SGE    // guarded by wlock

	mu sync.Mutex // guards rx, tx, ctrl and the state below
	rx rxState
	tx txState
	// ctrlAvail is how many control messages (grants, shutdown) may be posted: their
	// send WRs are kept apart from data's, as librdmacm keeps RS_QP_CTRL_SIZE.
	ctrlAvail int
	inflight  int                  // posted sends not yet completed
	sentDisc  bool                 // this side posted DISCONNECT
	peerDisc  bool                 // the peer sent DISCONNECT
	buffers   map[*Buffer]struct{} // registered with RegisterBuffer, deregistered by Close
	closing   bool                 // Close was called
	closed    bool                 // Close has told the peer: every call fails
	err       error                // why the connection failed, if it did
	stats     Stats
	// corked says that bytes wait in the send buffer (tx.pend), so a Read or a completion
	// tries to send them; flushTimer sends them if nothing else does (armed: flushArmed).
	corked     atomic.Bool
	flushTimer *time.Timer
	flushArmed bool
	corkWait   time.Duration // corkTimeout (tests wait longer)

	rwake, wwake chan struct{} // a state change readers or writers wait for
	done         chan struct{} // closed by Close
	rdl, wdl     deadline
}

// Stats count what a connection received that it did not act on, and why.
type Stats struct {
	Messages   uint64 // data messages received
	Grants     uint64 // grants of ring space received
	Ignored    uint64 // messages of operations this side does not take (iomap, unknown)
	Violations uint64 // messages that broke the protocol (each ends the connection)
}

// ctrlSlots is how many control messages may be outstanding (librdmacm's RS_QP_CTRL_SIZE).
const ctrlSlots = 4

// extraRecvs are the receives posted beyond the credits given: the peer's control
// messages, which no credit limits, take receives too.
const extraRecvs = ctrlSlots + 4

// maxMessage bounds a data message. librdmacm sends at most 64 KiB a message (the first
// of a send 2 KiB, each next one twice as large, so that the NIC starts on the first
// bytes while the rest are copied); its receiver takes any length up to a grant. Here a
// post is a system call in the writer's goroutine with nothing to overlap, so a message
// is as long as the send buffer, the grant and this bound allow.
const maxMessage = 1 << 20

// Work request IDs: the kind in the top byte, a data message's length below.
const (
	wrData   = 1 << 56
	wrCtrl   = 2 << 56
	wrDisc   = 3 << 56
	wrRecv   = 4 << 56
	wrBuffer = 5 << 56 // a data message from a Buffer
	wrIOMap  = 6 << 56 // an entry of the peer's iomap table
	wrKind   = 0xFF << 56
)

// rxState is the receiving side: the ring the peer writes into, what has arrived and
// not been read, and what has been granted.
type rxState struct {
	size, half uint32
	lens       []uint32 // lengths of the data messages arrived and not read, a FIFO
	head, n    int
	off        uint32 // where the next byte to read is
	partial    uint32 // bytes of the head message already read
	wpos       uint32 // where the next data message must land
	granted    uint32 // bytes granted to the peer and not yet written
	freeOff    uint32 // the start of the next grant
	avail      uint32 // bytes read and not yet granted again
	seq        uint16 // data messages read
	seqComp    uint16 // when to send credits again
	slot       int    // the peer's grant slot the next grant goes to
	peerDone   bool   // the peer writes no more (SHUTDOWN or DISCONNECT)
	shut       bool   // CloseRead: what arrives is dropped
}

// txState is the sending side: the grants of the peer's ring, the credits, and the
// send buffer.
type txState struct {
	grants    [grantSlots]sge // a FIFO of grants not yet filled
	gHead, gN int
	nextSlot  int    // the slot of this side's target area the peer writes next
	seq       uint16 // data messages sent
	seqComp   uint16 // the credit limit the peer gave
	sqe       int    // data send WRs free
	head      uint32 // where the next byte goes in the send buffer
	avail     uint32 // free bytes of the send buffer
	pend      uint32 // bytes before head written and not yet posted (one message to be)
	dataOut   int    // data messages posted and not yet completed
	shut      bool   // CloseWrite
	// fromBuffers counts data messages posted from a Buffer and not yet completed:
	// WriteBuffer returns when its own are done.
	fromBuffers int
}

// canSend says whether a data message may be posted now: a send WR free, a grant to
// write into and a credit to spend.
func (t *txState) canSend() bool { return t.sqe > 0 && t.gN > 0 && t.seq != t.seqComp }

func (r *rxState) push(n uint32) {
	r.lens[(r.head+r.n)%len(r.lens)] = n
	r.n++
}

// readable returns the offset and length of the unread bytes of the head message.
func (r *rxState) readable() (off, n uint32) {
	if r.n == 0 {
		return 0, 0
	}
	return r.off, r.lens[r.head] - r.partial
}

// consume marks k bytes of the head message read.
func (r *rxState) consume(k uint32) {
	r.partial += k
	r.off = (r.off + k) % r.size
	r.avail += k
	if r.partial == r.lens[r.head] {
		r.head = (r.head + 1) % len(r.lens)
		r.n--
		r.partial = 0
		r.seq++
	}
}

// needCredits says whether the peer should get credits or a grant now.
func (c *Conn) needCreditsLocked() bool {
	r := &c.rx
	return c.ctrlAvail > 0 && c.err == nil && !c.closed && !c.sentDisc && !r.peerDone &&
		(r.avail >= r.half || int16(r.seq-r.seqComp) >= 0)
}

// giveCredits sends the peer credits, and a grant of half the ring if half is free.
func (c *Conn) giveCredits() {
	c.ctrlMu.Lock()
	defer c.ctrlMu.Unlock()
	c.mu.Lock()
	ok := c.creditsLocked(&c.ctrlWR[0])
	c.mu.Unlock()
	if !ok {
		return
	}
	if err := c.qp.PostSend(c.ctrlWR[:]); err != nil {
		c.fail(fmt.Errorf("post a grant: %w", err))
	}
}

// creditsLocked makes wr the credits (and grant) due to the peer, if any, and counts
// them given (mu and ctrlMu held).
func (c *Conn) creditsLocked(wr *verbs.SendWR) bool {
	if !c.needCreditsLocked() {
		return false
	}
	r := &c.rx
	r.seqComp = r.seq + uint16(c.rq/2)
	credit := uint32(r.seq + uint16(c.rq))
	*wr = verbs.SendWR{WRID: wrCtrl, Opcode: verbs.WRRDMAWriteWithImm, SendFlags: verbs.SendSignaled | verbs.SendInline,
		ImmData: imm(opSGL, credit)}
	if r.avail >= r.half {
		g := sge{Addr: c.ring.Addr() + uint64(r.freeOff), Key: c.ring.RKey(), Len: r.half}
		scratch := c.o.SendBuffer // the grant scratch, after the send buffer
		putSGE(c.sbuf.Buf()[scratch:], g, c.peerBE)
		c.ctrlSGE[0] = c.sbuf.SGE(scratch, sgeLen)
		wr.SGList = c.ctrlSGE[:]
		wr.RemoteAddr = c.peerTarget.Addr + uint64(sgeLen*r.slot)
		wr.RKey = c.peerTarget.Key
		r.freeOff = (r.freeOff + r.half) % r.size
		r.avail -= r.half
		r.granted += r.half
		r.slot = (r.slot + 1) % grantSlots
	}
	c.ctrlAvail--
	c.inflight++
	return true
}

// postCtrl sends a control code (DISCONNECT or SHUTDOWN), waiting for a control slot
// at most until the connection's end or the deadline dl.
func (c *Conn) postCtrl(code uint32, dl <-chan struct{}) error {
	for {
		c.ctrlMu.Lock()
		c.mu.Lock()
		if c.err != nil || c.peerDisc || c.sentDisc {
			c.mu.Unlock()
			c.ctrlMu.Unlock()
			return nil
		}
		if c.ctrlAvail > 0 {
			c.ctrlAvail--
			c.inflight++
			id := uint64(wrCtrl)
			if code == ctrlDisconnect {
				c.sentDisc = true
				id = wrDisc
			}
			c.mu.Unlock()
			c.ctrlWR[0] = verbs.SendWR{WRID: id, Opcode: verbs.WRRDMAWriteWithImm, SendFlags: verbs.SendSignaled,
				ImmData: imm(opCtrl, code)}
			err := c.qp.PostSend(c.ctrlWR[:])
			c.ctrlMu.Unlock()
			if err != nil {
				c.fail(fmt.Errorf("post a control message: %w", err))
			}
			return err
		}
		c.mu.Unlock()
		c.ctrlMu.Unlock()
		if err := c.waitEvent(c.wwake, dl); err != nil {
			return err
		}
	}
}

// fail ends the connection with err (the first failure is kept) and wakes every call.
func (c *Conn) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.mu.Unlock()
	wake(c.rwake)
	wake(c.wwake)
}

func wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// onEvent takes the queue's completion events and the completions. The event may have
// been for the other direction's completion: while another call sleeps, the queue is
// armed again for it.
func (c *Conn) onEvent() {
	for {
		cq, ok := c.ch.TryGetCQEvent()
		if !ok {
			break
		}
		cq.AckCQEvents(1)
	}
	c.progress()
	if c.sleepers.Load() > 1 && c.cq.ReqNotifyCQ(false) == nil {
		c.progress()
	}
}

// progress takes the completions waiting and acts on them. Whoever calls it while
// another goroutine polls leaves the poll to that one, which looks again before it
// lets go; so progress never waits for another poller, and no completion is missed.
// It says whether this call took any.
func (c *Conn) progress() bool {
	did := false
	c.pollWanted.Store(true)
	for c.pollWanted.Load() && c.pollMu.TryLock() {
		c.pollWanted.Store(false)
		did = c.pollLocked() || did
		c.pollMu.Unlock()
	}
	return did
}

// pollLocked drains the completion queue (pollMu held).
func (c *Conn) pollLocked() bool {
	did := false
	for {
		n := c.cq.PollCQ(c.wcs)
		if n == 0 {
			return did
		}
		did = true
		recvs, rxChanged, txChanged := 0, false, false
		c.mu.Lock()
		for i := range c.wcs[:n] {
			wc := &c.wcs[i]
			if wc.WRID&wrKind == wrRecv {
				if wc.Status == verbs.WCSuccess {
					recvs++ // a flushed receive is not posted again
				}
				rxChanged = c.onRecv(wc) || rxChanged
				txChanged = true // a grant, credits or a control code
			} else {
				c.onSend(wc)
				txChanged = true
			}
		}
		credits := c.needCreditsLocked()
		flush := c.tx.pend > 0 && c.tx.dataOut == 0
		c.mu.Unlock()
		if flush {
			c.tryFlush() // the last message went out: what waited for it follows
		}
		if recvs > 0 {
			// Receives go back at once (they carry no buffers), as librdmacm reposts them.
			_ = c.qp.PostRecv(c.recvs[:recvs])
		}
		if credits {
			c.giveCredits()
		}
		if rxChanged {
			wake(c.rwake)
		}
		if txChanged {
			wake(c.wwake)
		}
		if n < len(c.wcs) {
			return did
		}
	}
}

// onRecv acts on a receive completion: an RDMA WRITE with immediate from the peer
// (mu held). It says whether readers have something new.
func (c *Conn) onRecv(wc *verbs.WorkCompletion) bool {
	if wc.Status != verbs.WCSuccess {
		if wc.Status != verbs.WCWRFlushErr && c.err == nil {
			c.err = wcError("receive", wc)
		}
		return true
	}
	if c.err != nil {
		return false // the connection has failed: nothing more is taken from the peer
	}
	op, v := immOp(wc.ImmData)
	switch op {
	case opData:
		return c.onData(v, wc.ByteLen)
	case opSGL:
		c.stats.Grants++
		c.tx.seqComp = uint16(v)
		switch wc.ByteLen {
		case 0:
		case sgeLen:
			t := &c.tx
			if t.gN == grantSlots {
				return c.violation("a grant while %d were unfilled", t.gN)
			}
			g := getSGE(c.target.Buf()[sgeLen*t.nextSlot:])
			t.nextSlot = (t.nextSlot + 1) % grantSlots
			if g.Len == 0 {
				return c.violation("an empty grant")
			}
			t.grants[(t.gHead+t.gN)%grantSlots] = g
			t.gN++
		default:
			return c.violation("a grant of %d bytes", wc.ByteLen)
		}
		return false
	case opCtrl:
		switch v {
		case ctrlDisconnect:
			c.peerDisc = true
			c.rx.peerDone = true
		case ctrlShutdown:
			c.rx.peerDone = true
			if c.tx.shut {
				c.peerDisc = true
			}
		default:
			c.stats.Ignored++
		}
		return true
	case opIOMapSGL:
		return c.onIOMap(v, wc.ByteLen)
	default: // operations librdmacm never sends
		c.stats.Ignored++
		return false
	}
}

// onData takes a data message of n bytes: it must fit the space granted, in the order
// granted, without crossing the end of a grant (mu held).
func (c *Conn) onData(n, byteLen uint32) bool {
	r := &c.rx
	switch {
	case n != byteLen:
		return c.violation("data of %d bytes says %d", byteLen, n)
	case n > r.granted:
		return c.violation("%d bytes of data where %d were granted", n, r.granted)
	case r.wpos%r.half+n > r.half:
		return c.violation("%d bytes of data across the end of a grant", n)
	case r.n == len(r.lens):
		return c.violation("more data messages than credits")
	}
	c.stats.Messages++
	r.granted -= n
	r.wpos = (r.wpos + n) % r.size
	if n == 0 {
		r.seq++ // a credit spent on nothing
		return false
	}
	r.push(n)
	if r.shut {
		r.consume(n)
	}
	return true
}

// violation ends the connection for a message that breaks the protocol (mu held).
func (c *Conn) violation(format string, args ...any) bool {
	c.stats.Violations++
	if c.err == nil {
		c.err = fmt.Errorf("protocol violation by the peer: "+format, args...)
	}
	return true
}

// onSend acts on a send completion (mu held).
func (c *Conn) onSend(wc *verbs.WorkCompletion) {
	c.inflight--
	switch wc.WRID & wrKind {
	case wrData:
		c.tx.sqe++
		c.tx.dataOut--
		c.tx.avail += uint32(wc.WRID &^ wrKind)
	case wrBuffer:
		c.tx.sqe++
		c.tx.dataOut--
		c.tx.fromBuffers--
	case wrIOMap:
		c.tx.sqe++
	default:
		c.ctrlAvail++
	}
	// A flushed request says only that the QP failed or was disconnected: the cause
	// came before it, or comes from the connection manager (waitUntil).
	if wc.Status != verbs.WCSuccess && wc.Status != verbs.WCWRFlushErr && c.err == nil {
		c.err = wcError("send", wc)
	}
}

// wcError describes a failed work request.
func wcError(what string, wc *verbs.WorkCompletion) error {
	if wc.VendorErr == 0 {
		return fmt.Errorf("%s: %v", what, wc.Status)
	}
	return fmt.Errorf("%s: %v (%v)", what, wc.Status, wc.VendorErr)
}

// waitEvent waits until ch is signalled, the deadline channel dl closes, the
// connection is closed or its connection manager reports it ended: first polling for
// BusyPoll, then armed for a completion event. A nil result means: look again.
func (c *Conn) waitEvent(ch chan struct{}, dl <-chan struct{}) error {
	return c.waitUntil(ch, dl, c.done)
}

// pollers counts the calls polling, in every connection of the process.
var pollers atomic.Int32

// busyPoll polls the connection's completion queue (and through it the device's
// socket) for up to BusyPoll, and says whether it found something. It does not poll
// while GOMAXPROCS calls already do: those hold every processor, and one more would
// only take a processor from them and from the device's goroutines.
func (c *Conn) busyPoll(ch chan struct{}, dl, stop <-chan struct{}) bool {
	defer pollers.Add(-1)
	if int(pollers.Add(1)) > runtime.GOMAXPROCS(0) {
		return false
	}
	end := time.Now().Add(c.o.BusyPoll)
	for !isClosed(dl) && !isClosed(stop) && time.Now().Before(end) {
		if c.progress() {
			return true
		}
		select {
		case <-ch:
			return true
		default:
		}
		runtime.Gosched() // the goroutines with work to do (a handler, a writer) go first
	}
	return false
}

// waitUntil is waitEvent with stop in place of the connection's Close (nil: Close's own
// waits, which must not end at it).
func (c *Conn) waitUntil(ch chan struct{}, dl, stop <-chan struct{}) error {
	if c.o.BusyPoll > 0 && c.busyPoll(ch, dl, stop) {
		return nil
	}
	// Counted as asleep before arming: whoever takes an event re-arms the queue while
	// another call sleeps (onEvent).
	c.sleepers.Add(1)
	defer c.sleepers.Add(-1)
	if err := c.cq.ReqNotifyCQ(false); err != nil {
		return err
	}
	if c.progress() {
		return nil
	}
	select {
	case <-c.ch.Ready():
		c.onEvent()
	case <-ch:
	case <-dl:
		return os.ErrDeadlineExceeded
	case <-stop:
		return net.ErrClosed
	case <-c.cn.Done():
		c.progress()
		c.mu.Lock()
		if c.err == nil && !c.peerDisc {
			if err := c.cn.Err(); errors.Is(err, cm.ErrDisconnected) {
				// Disconnected without rsockets' DISCONNECT first: the end of the
				// stream all the same.
				c.peerDisc, c.rx.peerDone = true, true
			} else {
				c.err = err // the peer is gone: an error, not an end of stream
			}
		}
		c.mu.Unlock()
	}
	return nil
}

func (c *Conn) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: "rsocket", Source: &c.local, Addr: &c.remote, Err: err}
}

// Read reads what the peer wrote, as a TCP Read does: at most len(b) bytes of what has
// arrived, waiting for some if none has; io.EOF once the peer closed or shut down its
// writing and every byte was read.
func (c *Conn) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	c.rlock.Lock()
	defer c.rlock.Unlock()
	if c.corked.Load() {
		c.tryFlush() // what was written goes out before this side waits for an answer
	}
	for {
		if isClosed(c.rdl.wait()) {
			return 0, c.opError("read", os.ErrDeadlineExceeded)
		}
		off, n, err := c.readable("read")
		if n == 0 && err != nil {
			return 0, err
		}
		if n > 0 {
			// What has arrived, message after message, as far as b goes.
			total := 0
			for n > 0 {
				k := copy(b[total:], c.ring.Buf()[off:off+n])
				c.consumed(uint32(k))
				total += k
				if total == len(b) {
					break
				}
				off, n, _ = c.readable("read")
			}
			return total, nil
		}
		if err := c.waitEvent(c.rwake, c.rdl.wait()); err != nil {
			return 0, c.opError("read", err)
		}
	}
}

// readable returns where the next unread bytes are (rlock held), or why there are
// none: io.EOF, or an error for op.
func (c *Conn) readable(op string) (off, n uint32, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, 0, c.opError(op, net.ErrClosed)
	}
	if c.rx.shut {
		return 0, 0, io.EOF
	}
	if off, n = c.rx.readable(); n > 0 {
		return off, n, nil
	}
	if c.rx.peerDone {
		// The peer's SHUTDOWN or DISCONNECT came after all its data: the stream ended
		// cleanly, whatever failed after it (librdmacm moves its QP to ERR then).
		return 0, 0, io.EOF
	}
	if c.err != nil {
		return 0, 0, c.opError(op, c.err)
	}
	return 0, 0, nil
}

// consumed marks k bytes read and gives credits if they are due.
func (c *Conn) consumed(k uint32) {
	c.mu.Lock()
	c.rx.consume(k)
	credits := c.needCreditsLocked()
	c.mu.Unlock()
	if credits {
		c.giveCredits()
	}
}

// WriteTo writes what the peer sends to w until io.EOF, straight from the receive ring
// (io.Copy uses it).
func (c *Conn) WriteTo(w io.Writer) (int64, error) {
	c.rlock.Lock()
	defer c.rlock.Unlock()
	var total int64
	for {
		if isClosed(c.rdl.wait()) {
			return total, c.opError("read", os.ErrDeadlineExceeded)
		}
		off, n, err := c.readable("read")
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
		if n == 0 {
			if err := c.waitEvent(c.rwake, c.rdl.wait()); err != nil {
				return total, c.opError("read", err)
			}
			continue
		}
		k, werr := w.Write(c.ring.Buf()[off : off+n])
		total += int64(k)
		c.consumed(uint32(k))
		if werr != nil {
			return total, werr
		}
	}
}

// Write writes b to the stream, waiting for the peer's credits and ring space as
// needed, and returns once every byte is copied into the send buffer and posted.
func (c *Conn) Write(b []byte) (int, error) {
	c.wlock.Lock()
	defer c.wlock.Unlock()
	done := 0
	for done < len(b) {
		off, room, err := c.writable(len(b) - done)
		if err != nil {
			return done, err
		}
		if room == 0 {
			continue
		}
		copy(c.sbuf.Buf()[off:], b[done:done+int(room)])
		if err := c.wrote(room); err != nil {
			return done, err
		}
		done += int(room)
	}
	return done, nil
}

// ReadFrom writes what r yields to the stream until io.EOF, reading straight into the
// send buffer (io.Copy uses it).
func (c *Conn) ReadFrom(r io.Reader) (int64, error) {
	if r == io.Reader(c) {
		return 0, c.opError("write", errors.New("ReadFrom the connection itself"))
	}
	c.wlock.Lock()
	defer c.wlock.Unlock()
	var total int64
	for {
		off, room, err := c.writable(maxMessage)
		if err != nil {
			return total, err
		}
		if room == 0 {
			continue
		}
		k, rerr := r.Read(c.sbuf.Buf()[off : off+room])
		if k > 0 {
			if err := c.wrote(uint32(k)); err != nil {
				return total, err
			}
			total += int64(k)
		}
		if rerr == io.EOF {
			return total, nil
		}
		if rerr != nil {
			return total, rerr
		}
	}
}

// writable returns where in the send buffer the next message of at most want bytes
// goes and how long it may be (wlock held); zero after a wait, to look again.
func (c *Conn) writable(want int) (off, room uint32, err error) {
	return c.sendable(want, true)
}

// sendable is writable for a message from the send buffer (sbuf) or from memory of
// the caller's (a Buffer), which the send buffer's space does not limit.
func (c *Conn) sendable(want int, sbuf bool) (off, room uint32, err error) {
	dl := c.wdl.wait()
	c.mu.Lock()
	t := &c.tx
	if err := c.writeErrLocked(dl); err != nil {
		c.mu.Unlock()
		return 0, 0, c.opError("write", err)
	}
	if t.canSend() {
		limit := min(maxMessage, t.grants[t.gHead].Len) // of one message
		switch {
		case sbuf && t.avail > 0:
			// Bytes written go after those waiting to be posted, into the same message.
			size := uint32(c.o.SendBuffer)
			room, off = min(uint32(want), limit-min(limit, t.pend), t.avail, size-t.head), t.head
			if room > 0 {
				c.mu.Unlock()
				return off, room, nil
			}
			// The message waiting (room is short only of its bytes) is as long as it may
			// be: post it, look again.
			return 0, 0, c.postPendLocked()
		case t.pend > 0:
			// What waits goes first: before a message from elsewhere, and before a
			// Write waits for send buffer space.
			return 0, 0, c.postPendLocked()
		case !sbuf:
			c.mu.Unlock()
			return 0, min(uint32(want), limit), nil
		}
	}
	c.mu.Unlock()
	if err := c.waitEvent(c.wwake, dl); err != nil {
		return 0, 0, c.opError("write", err)
	}
	return 0, 0, nil
}

// writeErrLocked is why nothing may be written now, if anything (mu held).
func (c *Conn) writeErrLocked(dl <-chan struct{}) error {
	switch {
	case c.closed:
		return net.ErrClosed
	case isClosed(dl):
		return os.ErrDeadlineExceeded
	case c.tx.shut:
		return syscall.EPIPE
	case c.err != nil:
		return c.err
	case c.peerDisc:
		return syscall.ECONNRESET
	}
	return nil
}

// wrote takes n bytes copied into the send buffer at its head (wlock held, after
// writable said they fit): they join the bytes waiting to be posted, and the message
// goes now unless it may wait for the one on its way.
//
// A message waits (is corked, as TCP corks a socket's data while the NIC still sends
// what came before) while an earlier data message is on its way and it could still
// grow: every message costs a work request, a completion on each side, and system calls
// to send and receive it, so bytes written back to back go out as one message when the
// writer is faster than the link, and at once when it is not. What waits goes out when
// the earlier messages are completed (whoever polls), when this side reads, before
// anything else is posted, and at the latest after corkTimeout.
func (c *Conn) wrote(n uint32) error {
	c.mu.Lock()
	t := &c.tx
	size := uint32(c.o.SendBuffer)
	t.head = (t.head + n) % size
	t.avail -= n
	t.pend += n
	if !c.o.NoDelay && t.dataOut > 0 && t.head != 0 && t.pend < min(maxMessage, t.grants[t.gHead].Len) {
		if !c.flushArmed {
			c.flushArmed = true
			c.flushTimer.Reset(c.corkWait)
		}
		c.corked.Store(true)
		c.mu.Unlock()
		return nil
	}
	return c.postPendLocked()
}

// corkTimeout bounds how long written bytes wait for the message before them when no
// call of the connection's polls its completions.
const corkTimeout = time.Millisecond

// postPendLocked posts the bytes waiting in the send buffer as one data message (wlock
// and mu held, a send WR, a credit and a grant available; it unlocks mu).
func (c *Conn) postPendLocked() error {
	t := &c.tx
	n := t.pend
	off := (t.head + uint32(c.o.SendBuffer) - n) % uint32(c.o.SendBuffer)
	t.pend = 0
	c.corked.Store(false)
	return c.postLocked(c.sbuf.SGE(int(off), int(n)), wrData|uint64(n))
}

// flushPending posts the bytes waiting in the send buffer, if they may go now (wlock
// held): other posts go after them, and Reads and completions send them.
func (c *Conn) flushPending() error {
	c.mu.Lock()
	t := &c.tx
	if t.pend == 0 || c.closed || c.err != nil || !t.canSend() {
		c.mu.Unlock()
		return nil
	}
	return c.postPendLocked()
}

// sendPending posts the bytes waiting in the send buffer, waiting for the send WR,
// credit and grant they need until the deadline dl or stop (wlock held): a SHUTDOWN or
// DISCONNECT must not overtake them. After a failure they are dropped with the rest.
func (c *Conn) sendPending(dl, stop <-chan struct{}) error {
	for c.corked.Load() {
		if err := c.flushPending(); err != nil {
			return err
		}
		c.mu.Lock()
		if c.tx.pend > 0 && (c.closed || c.err != nil || c.peerDisc) {
			c.tx.pend = 0
			c.corked.Store(false)
		}
		c.mu.Unlock()
		if !c.corked.Load() {
			return nil
		}
		if err := c.waitUntil(c.wwake, dl, stop); err != nil {
			return err
		}
	}
	return nil
}

// tryFlush posts the bytes waiting in the send buffer unless a call that writes is
// running, which then posts them itself.
func (c *Conn) tryFlush() {
	if c.wlock.TryLock() {
		c.flushPending()
		c.wlock.Unlock()
	}
}

// onFlushTimer sends what waits when nothing else did (the timer's goroutine); while
// it cannot, it looks again after corkTimeout.
func (c *Conn) onFlushTimer() {
	c.tryFlush()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.flushArmed = c.tx.pend > 0 && !c.closed && c.err == nil
	if c.flushArmed {
		c.flushTimer.Reset(c.corkWait)
	}
}

// postLocked sends sg as one data message into the current grant (wlock and mu held;
// it unlocks mu).
func (c *Conn) postLocked(sg verbs.SGE, id uint64) error {
	t := &c.tx
	n := sg.Length
	g := &t.grants[t.gHead]
	wr := &c.dataWR[0]
	c.dataSGE[0] = sg
	*wr = verbs.SendWR{WRID: id, SGList: c.dataSGE[:], Opcode: verbs.WRRDMAWriteWithImm,
		SendFlags: verbs.SendSignaled, ImmData: imm(opData, n), RemoteAddr: g.Addr, RKey: g.Key}
	if int(n) <= c.o.InlineSize {
		wr.SendFlags |= verbs.SendInline
	}
	g.Addr += uint64(n)
	g.Len -= n
	if g.Len == 0 {
		t.gHead = (t.gHead + 1) % grantSlots
		t.gN--
	}
	t.sqe--
	t.seq++
	t.dataOut++
	c.inflight++
	c.mu.Unlock()
	if err := c.qp.PostSend(c.dataWR[:]); err != nil {
		c.fail(fmt.Errorf("post data: %w", err))
		return c.opError("write", err)
	}
	return nil
}

// CloseWrite shuts down the writing side, as a TCP half-close does: the peer reads
// io.EOF after what was written; this side may go on reading.
func (c *Conn) CloseWrite() error {
	c.wlock.Lock()
	defer c.wlock.Unlock()
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return c.opError("close", net.ErrClosed)
	}
	if c.tx.shut {
		c.mu.Unlock()
		return nil
	}
	c.mu.Unlock()
	if err := c.sendPending(c.wdl.wait(), c.done); err != nil { // the bytes written go before the SHUTDOWN
		return c.opError("close", err)
	}
	c.mu.Lock()
	c.tx.shut = true
	code := uint32(ctrlShutdown)
	if c.rx.shut || c.rx.peerDone {
		code = ctrlDisconnect
	}
	c.mu.Unlock()
	wake(c.wwake)
	if err := c.postCtrl(code, c.wdl.wait()); err != nil {
		return c.opError("close", err)
	}
	return nil
}

// CloseRead shuts down the reading side: Reads return io.EOF, and what the peer still
// writes is dropped.
func (c *Conn) CloseRead() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return c.opError("close", net.ErrClosed)
	}
	r := &c.rx
	if r.shut {
		c.mu.Unlock()
		return nil
	}
	r.shut = true
	for r.n > 0 {
		_, n := r.readable()
		r.consume(n)
	}
	credits := c.needCreditsLocked()
	disc := c.tx.shut
	c.mu.Unlock()
	wake(c.rwake)
	if credits {
		c.giveCredits()
	}
	if disc {
		if err := c.postCtrl(ctrlDisconnect, c.wdl.wait()); err != nil {
			return c.opError("close", err)
		}
	}
	return nil
}

// closeWait bounds how long Close waits for its DISCONNECT and the connection
// manager's disconnection.
const closeWait = time.Second

// Close closes the connection: blocked Reads and Writes return, the peer is told
// (rsockets' DISCONNECT, then the connection manager's DREQ) and the connection's
// memory and queues are freed. It waits for the peer's acknowledgements at most a
// second.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return c.opError("close", net.ErrClosed)
	}
	c.closing = true // one Close runs; the others return at once
	c.mu.Unlock()
	bound := make(chan struct{})
	boundTimer := time.AfterFunc(closeWait, func() { close(bound) })
	defer boundTimer.Stop()
	// Tell the peer while Reads and Writes may still be blocked: they return once
	// c.closed is set below. The bytes written before go first, unless a Write still
	// runs (it would post them itself).
	if c.wlock.TryLock() {
		c.sendPending(nil, bound)
		c.wlock.Unlock()
	}
	c.postCtrl(ctrlDisconnect, bound)
	c.mu.Lock()
	c.closed = true
	c.flushTimer.Stop()
	c.mu.Unlock()
	close(c.done)
	wake(c.rwake)
	wake(c.wwake)
	// Wait for a Read or Write that was already past its check of c.closed (copying
	// from the ring or into the send buffer) to leave; later ones fail at that check.
	c.rlock.Lock()
	defer c.rlock.Unlock()
	c.wlock.Lock()
	defer c.wlock.Unlock()
	// Let the sends finish (their memory is freed below).
	for {
		c.mu.Lock()
		idle := c.inflight == 0 || c.err != nil
		c.mu.Unlock()
		if idle || isClosed(bound) {
			break
		}
		if c.waitUntil(c.wwake, bound, nil) != nil {
			break
		}
	}
	ctx, cancel := contextUntil(bound)
	errs := []error{c.cn.DisconnectContext(ctx)}
	cancel()
	errs = append(errs, c.release())
	if err := errors.Join(errs...); err != nil && !errors.Is(err, cm.ErrDisconnected) {
		return c.opError("close", err)
	}
	return nil
}

// release frees the connection's verbs objects.
func (c *Conn) release() error {
	var errs []error
	if c.qp != nil {
		errs = append(errs, c.qp.DestroyQP())
	}
	if c.cq != nil {
		for {
			cq, ok := c.ch.TryGetCQEvent()
			if !ok {
				break
			}
			cq.AckCQEvents(1)
		}
		errs = append(errs, c.cq.DestroyCQ())
	}
	if c.ch != nil {
		errs = append(errs, c.ch.DestroyCompChannel())
	}
	c.mu.Lock()
	buffers := c.buffers
	c.buffers = nil
	c.mu.Unlock()
	for b := range buffers {
		errs = append(errs, b.mr.DeregMR())
	}
	for _, mr := range []*verbs.MR{c.ring, c.target, c.sbuf} {
		if mr != nil {
			errs = append(errs, mr.DeregMR())
		}
	}
	if c.pd != nil {
		errs = append(errs, c.pd.DeallocPD())
	}
	return errors.Join(errs...)
}

// LocalAddr is this side's address: the device's, or the listener's for an accepted
// connection.
func (c *Conn) LocalAddr() net.Addr { return &c.local }

// RemoteAddr is the peer's address: the listener's for a dialled connection, the peer
// device's for an accepted one.
func (c *Conn) RemoteAddr() net.Addr { return &c.remote }

// SetDeadline sets the read and write deadlines.
func (c *Conn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

// SetReadDeadline sets when a blocked Read gives up (zero: never), also for a Read
// already waiting.
func (c *Conn) SetReadDeadline(t time.Time) error {
	if c.isClosed() {
		return c.opError("set", net.ErrClosed)
	}
	c.rdl.set(t)
	return nil
}

// SetWriteDeadline sets when a blocked Write gives up (zero: never), also for a Write
// already waiting.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	if c.isClosed() {
		return c.opError("set", net.ErrClosed)
	}
	c.wdl.set(t)
	return nil
}

func (c *Conn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// Stats returns what the connection received that it did not act on.
func (c *Conn) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// Ordering is the ordering mode of the connection's QP.
func (c *Conn) Ordering() verbs.Ordering { return c.cn.Ordering() }

var _ net.Conn = (*Conn)(nil)

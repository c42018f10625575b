package transport

import (
	"errors"
	"net/netip"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/wire"
)

// queue is one of a device's receive queues, as a NIC has several: a UDP socket bound to
// the device's address and port (with SO_REUSEPORT when there are several), the goroutine
// that receives from it, the receive path's state and the timers of the QPs it owns. A QP
// lives on one queue, number QPN mod the number of queues, which is also the socket the
// kernel hands its packets to (netio.SteerByQP): its packets, ACKs, responses and timers
// are handled by one queue's goroutines, and queues share nothing on the hot path but
// the device's tables. Packets leave through the device's first socket (sending needs no
// queue: the socket's send path takes no lock a queue would wait on).
type queue struct {
	d    *Device
	idx  int
	conn *netio.Conn

	// Receive path state, owned by whoever holds rxMu (the receive goroutine, or a
	// polling consumer driving progress).
	rxMu     mutex
	rxBatch  *netio.RecvBatch
	rxOut    *netio.SendBatch
	ackList  []*QP
	kickList []*QP
	respList []*QP
	// respLater holds QPs that spent their response budget in this round: their responses
	// go on in the next round, after the socket was read again (see finishBatch).
	respLater []*QP
	respRound uint32
	// parked: the receive goroutine went to sleep in the network poller (rxMu held to
	// read or write). A polling consumer that leaves responses pending rings the doorbell.
	parked   bool
	owned    []*QP
	deferred []*QP // QPs with an ACK held back (see progress)
	// The spare halves of kickList and respList, swapped in so draining a list does not
	// allocate a new one.
	kickSpare, respSpare []*QP
	polling              bool // the receive path runs in a polling consumer's goroutine
	flushNow             bool // rxOut holds an ACK that should not wait for the batch's end
	rx                   rxStats
	rxPkt                wire.Packet    // the packet being processed (not on the stack: it goes through the mode interface)
	ids                  wire.IDSolver  // the ICRC's identification arithmetic, as tables for frequent lengths
	rxFrom               netip.AddrPort // where it came from
	quiesced             uint64         // Quiesce calls that waited for the receive path

	// polled is set when a consumer polls (progress) and cleared when the receive goroutine
	// looks: while consumers poll, the receive goroutine leaves the socket to them and ACKs
	// wait to ride along with their sends.
	polled   atomic.Bool
	yieldReq atomic.Bool // a completion handler was woken: yield after this batch

	holdingAcks atomic.Bool // ACKs are held back (see AckGroup.hold)
	// responding: READ responses wait for their next round (respList was not empty when the
	// last batch ended), which a poll sends even when the socket is empty.
	responding atomic.Bool
	crossAt    atomic.Int64 // when this queue's pollers may next flush other devices' ACKs (AckGroup.flushOthers)

	stalls stallWatch // whether empty polls leave the receive path alone
	// testPause, set by tests only, is called by a poll that found nothing to do without
	// taking the receive path, where it found out: it stands for the system stopping the
	// polling thread there.
	testPause func()

	timers timerQueue

	qps int // live QPs on the queue, the GSI QP aside (the device's qpMu held)
}

// rxLoop is the queue's receive goroutine: it sleeps in the runtime's network poller and
// runs every arriving packet to completion.
func (u *queue) rxLoop() {
	defer u.d.wg.Done()
	_ = u.conn.Serve(u.rxReady)
}

// rxReady drains the socket, then keeps polling for up to BusyPoll after the last packet
// it found before going back to sleep (unless a consumer is polling the queue, which then
// receives the packets itself). It returns true to stop serving (device closed).
func (u *queue) rxReady() bool {
	spin := int64(u.d.cfg.BusyPoll)
	u.rxMu.Lock()
	u.parked = false
	last := u.d.now()
	for i := 1; ; i++ {
		if u.d.closed.Load() {
			u.rxMu.Unlock()
			return true
		}
		n, err := u.poll()
		if err != nil {
			u.rxMu.Unlock()
			return errors.Is(err, netio.ErrClosed)
		}
		if n > 0 {
			u.processBatch(n)
			last = u.d.now()
			if u.yieldReq.Load() && u.yieldReq.Swap(false) {
				// The batch woke a completion handler: hand it this P now rather than
				// after the next batches (see RequestYield).
				u.rxMu.Unlock()
				runtime.Gosched()
				u.rxMu.Lock()
				continue
			}
		} else if len(u.respList) > 0 {
			u.finishBatch() // the next round of READ responses
			last = u.d.now()
		} else if spin <= 0 || u.d.now()-last >= spin || u.polled.Swap(false) {
			u.parked = true
			u.rxMu.Unlock()
			return false
		}
		if n == 0 || i%8 == 0 {
			// Let a polling consumer (and other goroutines) in.
			u.rxMu.Unlock()
			runtime.Gosched()
			u.rxMu.Lock()
		}
	}
}

// progress receives and processes whatever is queued on the socket, in the caller's
// goroutine, unless the receive path is busy elsewhere. Busy-polling consumers call it
// (through CQ.Progress) so a completion does not wait for the receive goroutine to wake.
// While the system stops polling threads (stallWatch), a poll with nothing to do leaves
// the receive path alone.
func (u *queue) progress() {
	if !u.polled.Load() {
		u.polled.Store(true)
	}
	u.d.acks.flushOthers(u)
	start := u.d.now()
	if u.stalls.looking(start) && !u.holdingAcks.Load() && !u.responding.Load() && !u.pending() {
		if u.testPause != nil {
			u.testPause()
		}
		return
	}
	if !u.rxMu.TryLock() {
		return
	}
	n := 0
	if !u.d.closed.Load() {
		u.flushDeferred()
		if n, _ = u.poll(); n > 0 {
			u.processBatch(n)
		} else if len(u.respList) > 0 {
			u.finishBatch()
		}
		if len(u.respList) > 0 && u.parked {
			// Responses remain for later rounds and the receive goroutine sleeps: wake it,
			// as this consumer may not poll again.
			u.parked = false
			u.conn.Doorbell(uint32(u.idx)) // steered to this queue's socket
		}
	}
	if n == 0 {
		u.stalls.held(start, u.d.now())
	}
	u.rxMu.Unlock()
}

// poll receives what is queued on the queue's socket into rxBatch, without waiting (rxMu
// held). A device without sockets has none: its test feeds the receive path itself.
func (u *queue) poll() (int, error) {
	if u.d.bare != nil {
		return 0, nil
	}
	return u.conn.Poll(u.rxBatch)
}

// pending reports whether a datagram waits on the queue's socket, without receiving it. A
// device without sockets has none.
func (u *queue) pending() bool { return u.d.bare == nil && u.conn.Pending() }

// drainReceive processes what waits in the socket before timers act (the timer
// goroutine, no lock held): a retransmission timeout must not fire for an ACK that has
// arrived but that the receive goroutine, starved of CPU on a machine busy with other
// work, has not read yet. Without this, on a loaded machine a QP could spend its retry
// count on answers queued in its own socket, and end in ERR.
func (u *queue) drainReceive() {
	u.rxMu.Lock()
	defer u.rxMu.Unlock()
	for i := 0; i < drainBatches && !u.d.closed.Load(); i++ {
		n, err := u.poll()
		if err != nil || n == 0 {
			return
		}
		u.processBatch(n)
	}
}

// drainBatches bounds drainReceive's work: a full socket is the receive goroutine's.
const drainBatches = 8

// ackDelay bounds how long an ACK is held back for piggybacking.
const ackDelay = 100 * time.Microsecond

// flushDeferred sends ACKs still held back (rxMu held).
func (u *queue) flushDeferred() {
	u.takeDeferred(0, false, u.rxOut)
	u.flushOut()
}

// takeDeferred adds to b the ACKs held back for at least minAge ns, which are then held no
// longer (rxMu held). With try (another queue's poller taking them) a QP whose lock is
// taken is left for later: its own goroutine is busy with it. b is the receive path's own
// batch, sent whenever it fills up, or another, in which what does not fit is left held.
func (u *queue) takeDeferred(minAge int64, try bool, b *netio.SendBatch) {
	if len(u.deferred) == 0 {
		return
	}
	cutoff := u.d.now() - minAge + int64(ackDelay) // held since before now-minAge
	kept := u.deferred[:0]
	for _, q := range u.deferred {
		if !try {
			q.mu.Lock()
		} else if !q.mu.TryLock() {
			kept = append(kept, q)
			continue
		}
		switch {
		case !q.resp.ackDeferred || !q.resp.ackPending:
			q.resp.ackDeferred = false
		case minAge > 0 && q.resp.ackAt > cutoff:
			kept = append(kept, q)
		case b == u.rxOut:
			u.ackOutRelock(q)
		case b.Room(2, 64):
			q.resp.sendAck(b)
		default:
			kept = append(kept, q)
		}
		q.mu.Unlock()
	}
	clear(u.deferred[len(kept):])
	u.deferred = kept
	if len(kept) == 0 {
		u.d.acks.hold(u, false)
	}
}

// processBatch handles n received datagrams, splitting GRO-coalesced ones, then sends the
// ACKs and responses they caused. While a consumer polls the queue, ACKs are held back to
// ride along with its next send (see finishBatch).
func (u *queue) processBatch(n int) {
	u.polling = u.polled.Load()
	defer func() { u.polling = false }()
	for i := 0; i < n; i++ {
		data, seg, from := u.rxBatch.Datagram(i)
		if netio.IsDoorbell(data, from, u.d.local) {
			continue
		}
		if seg == 0 {
			u.input(data, from)
		} else {
			for len(data) > 0 {
				k := min(seg, len(data))
				u.input(data[:k], from)
				data = data[k:]
			}
		}
		if u.flushNow {
			u.flushNow = false
			u.flushOut()
		}
	}
	u.finishBatch()
}

// input handles one packet (rxMu held).
func (u *queue) input(pkt []byte, from netip.AddrPort) {
	u.rx.packets++
	u.rx.bytes += uint64(len(pkt))
	flow := wire.Flow{Src: from.Addr(), Dst: u.d.local.Addr(), SrcPort: from.Port(), DstPort: u.d.local.Port(), DF: u.d.v4}
	if u.placeDirect(&flow, pkt, from) {
		return
	}
	// Any IPv4 identification: a standard peer's is not 0, and a UDP socket does not show
	// it (see wire.VerifyICRCAnyID for what is then verified).
	id, ok := u.ids.VerifyICRCAnyID(&flow, pkt)
	if u.d.tap.w != nil {
		u.d.tap.received(from, id, pkt)
	}
	if len(pkt) < wire.BTHLen+wire.ICRCLen {
		u.rx.malformed++ // shorter than any RoCEv2 packet: no ICRC to check
		return
	}
	if !ok {
		u.rx.icrc++
		return
	}
	p := &u.rxPkt
	*p = wire.Packet{} // Decode sets only the fields the opcode has
	if p.Decode(pkt) != nil {
		u.rx.malformed++
		return
	}
	if p.BTH.PKey != wire.DefaultPKey {
		u.rx.pkey++
		return
	}
	q := u.d.lookupQP(p.BTH.DestQP)
	if q == nil {
		u.rx.unknownQP++
		return
	}
	if q.home != u {
		// Not steered to this queue: the QP's state is its own queue's to touch.
		u.rx.misrouted++
		return
	}
	if !u.rxOut.Room(outReserve, outReserve*96) {
		u.flushOut()
	}
	u.rxFrom = from
	q.input(p, from, len(pkt))
}

// directMin is the shortest packet placeDirect takes: below it the CRC does not fold
// (wire.crcCopy) and reading the payload twice costs little.
const directMin = 512

// placeDirect handles pkt, before its ICRC is verified, if it is the next packet of an
// RDMA WRITE its QP is placing (a MIDDLE or LAST: the QP's responder knows where its
// payload goes, QP.inputDirect): the ICRC is verified while the payload is copied into
// the region, so the receive path reads it once, as a NIC's header/data split places
// data as it checks it. It returns false, having changed nothing, for any other packet,
// which then takes the usual path (verified first). Nothing is decided on the unverified
// header but where to copy: the QP, PSN, opcode and length must be exactly what the
// responder expects next, and a packet that then fails its ICRC is dropped and counted
// as usual, its bytes left in the part of the message not yet placed, which the real
// packet overwrites before the message completes (what a WRITE's target holds before its
// completion is undefined in InfiniBand too).
func (u *queue) placeDirect(flow *wire.Flow, pkt []byte, from netip.AddrPort) bool {
	if len(pkt) < directMin || u.d.tap.w != nil {
		return false
	}
	if op := wire.Opcode(pkt[0]); op != wire.OpWriteMiddle && op != wire.OpWriteLast {
		return false
	}
	p := &u.rxPkt
	*p = wire.Packet{}
	if p.Decode(pkt) != nil || p.BTH.PKey != wire.DefaultPKey {
		return false
	}
	q := u.d.lookupQP(p.BTH.DestQP)
	if q == nil || q.home != u {
		return false
	}
	if !u.rxOut.Room(outReserve, outReserve*96) {
		u.flushOut()
	}
	u.rxFrom = from
	return q.inputDirect(u, flow, pkt, p, from)
}

// ackOutRelock adds q's ACK to the receive path's batch, sending the batch first if it is
// full (rxMu and q.mu held; q.mu is released around that send and taken again).
func (u *queue) ackOutRelock(q *QP) {
	if !u.rxOut.Room(2, 64) {
		q.mu.Unlock()
		u.flushOut()
		q.mu.Lock()
	}
	q.resp.sendAck(u.rxOut)
}

// flushOut sends what the receive path has built (rxMu held, no QP lock).
func (u *queue) flushOut() {
	if u.rxOut.Len() > 0 {
		u.d.send(u.rxOut)
	}
}

// finishBatch sends a round of pending read responses, coalesced ACKs and requester
// packets that the batch's ACKs released (rxMu held). In a round each QP sends at most
// respBudget response packets; a QP with more waits in respLater for the next round, which
// comes after the socket was read again (rxReady, progress), so that a peer's long READs
// cannot hold up other QPs' packets, ACKs and completions.
func (u *queue) finishBatch() {
	u.respRound++
	for len(u.respList) > 0 || len(u.ackList) > 0 || len(u.kickList) > 0 {
		// Read and atomic responses first: they must precede ACKs of later requests.
		for len(u.respList) > 0 {
			list := u.respList
			u.respList, u.respSpare = u.respSpare[:0], list
			for _, q := range list {
				q.mu.Lock()
				q.resp.queued = false
				if q.resp.round != u.respRound {
					q.resp.round, q.resp.budget = u.respRound, respBudget
				}
				if !q.resp.pumpResponses(u.rxOut) {
					if q.resp.budget == 0 {
						q.resp.queued = true
						u.respLater = append(u.respLater, q)
					} else {
						u.queueResp(q) // the batch filled up: send it, then go on
					}
				}
				q.mu.Unlock()
			}
			clear(list)
			if len(u.respList) > 0 {
				u.flushOut()
			}
		}
		for _, q := range u.ackList {
			q.mu.Lock()
			q.resp.ackQueued = false
			if q.resp.ackPending && !q.resp.pumping() {
				if u.polling {
					// A consumer is polling in this goroutine and will likely post next:
					// let the ACK ride along with that send (see requester.piggybackAck).
					if !q.resp.ackDeferred {
						q.resp.ackDeferred = true
						q.resp.ackAt = u.d.now() + int64(ackDelay)
						u.deferred = append(u.deferred, q)
						if len(u.deferred) == 1 {
							u.d.acks.hold(u, true)
						}
						u.timers.arm(q, q.resp.ackAt)
					}
					q.mu.Unlock()
					continue
				}
				u.ackOutRelock(q)
			}
			q.mu.Unlock()
		}
		u.ackList = u.ackList[:0]
		u.runKicks()
	}
	if !u.polling {
		u.flushDeferred()
	}
	u.flushOut()
	// What spent its budget is the next round's.
	u.respList = append(u.respList, u.respLater...)
	clear(u.respLater)
	u.respLater = u.respLater[:0]
	if more := len(u.respList) > 0; u.responding.Load() != more {
		u.responding.Store(more)
	}
}

// runKicks lets QPs whose window opened send more, from the receive path. A QP whose
// transmit is owned by another goroutine is left to that goroutine.
func (u *queue) runKicks() {
	for len(u.kickList) > 0 {
		list := u.kickList
		u.kickList, u.kickSpare = u.kickSpare[:0], list
		for _, q := range list {
			q.mu.Lock()
			q.kickQueued = false
			if q.txOwner {
				q.txPending = true
			} else {
				q.txOwner = true
				q.txMore = q.svc.fill(u.rxOut)
				u.owned = append(u.owned, q)
			}
			q.mu.Unlock()
		}
		u.flushOut()
		for _, q := range u.owned {
			q.mu.Lock()
			q.svc.transmitted()
			q.releaseTx()
			if q.txPending || q.txMore {
				q.txPending, q.txMore = false, false
				u.queueKick(q)
			}
			q.mu.Unlock()
		}
		clear(u.owned)
		u.owned = u.owned[:0]
	}
}

// queueKick asks the receive path to run q's requester at the end of the batch (rxMu held).
func (u *queue) queueKick(q *QP) {
	if !q.kickQueued {
		q.kickQueued = true
		u.kickList = append(u.kickList, q)
	}
}

func (u *queue) queueAck(q *QP) {
	if !q.resp.ackQueued {
		q.resp.ackQueued = true
		u.ackList = append(u.ackList, q)
	}
}

func (u *queue) queueResp(q *QP) {
	if !q.resp.queued {
		q.resp.queued = true
		u.respList = append(u.respList, q)
	}
}

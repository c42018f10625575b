package transport

import (
	"encoding/binary"

	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/tpt"
	"github.com/softrnic/softrnic/internal/wire"
)

const (
	resFree uint8 = iota
	resRead
	resAtomic
)

// respResource remembers an RDMA READ or atomic request, so its responses can be sent
// (and replayed for a duplicate request) without executing it again. There are
// max_dest_rd_atomic of them per QP, used in a ring.
type respResource struct {
	kind     uint8
	queued   bool     // on the pump list
	replay   bool     // being sent again for a duplicate request
	msn      uint32   // the MSN once this request was executed (its responses carry it)
	held     bool     // weak mode: prepared, waiting for the doorbell (the hole before it to close)
	fetchAdd bool     // weak mode, held atomic: FetchAdd (else CmpSwap)
	firstPSN wire.PSN // PSN range the request uses
	lastPSN  wire.PSN
	start    wire.PSN    // first PSN of the current (re)play: its response is FIRST/ONLY
	next     wire.PSN    // next response PSN to send
	stop     wire.PSN    // last PSN of the current (re)play
	mem      []byte      // READ: the checked source memory; held atomic: the target
	reg      *tpt.Region // the region mem lies in: checked for revocation before each use
	orig     uint64      // atomic: the value the target held before
	swapAdd  uint64      // weak mode, held atomic: operands
	compare  uint64
}

// responder is the receive side of an RC QP: what both ordering modes do alike. Its mode
// (order: orderedResponder or weakResponder) places or executes each request; the
// responder keeps the expected PSN and the MSN, the receive WQE of a message in progress,
// the READ and atomic resources and their responses (paced round by round), and decides
// when ACKs and NAKs go out, in the mode's form (requestOrder.ack). It also ends the
// connection when a request cannot be executed (respFatal).
type responder struct {
	q        *QP // the QP whose requests it answers
	order    requestOrder
	epsn     wire.PSN // expected PSN
	msn      uint32   // message sequence number
	haveRWQE bool     // rwqe holds the receive WQE of the message in progress
	rwqe     recvWQE
	nakSent  bool // a NAK for epsn went out; stay quiet until epsn arrives
	// A sequence or RNR NAK generated while READ/atomic responses are still queued waits
	// for them: responses leave in PSN order.
	nakHeld    bool
	nakSyn     uint8
	nakPSN     wire.PSN
	ackPending bool
	ackQueued  bool
	sinceAck   int // request packets since the last ACK went out
	// ackDeferred: the ACK was held back to ride along with the consumer's next send on
	// this QP (or the next poll, or the timer at ackAt).
	ackDeferred bool
	ackAt       int64
	queued      bool
	round       uint32 // the receive path's response round budget belongs to
	budget      int    // response packets this QP may still send in that round
	res         []respResource
	resNext     int
	pend        []int // resources with responses to send, in PSN order
}

func (rs *responder) init(q *QP) {
	rs.q = q
	rs.rwqe.segs = make([][]byte, 0, 4)
	rs.rwqe.regs = make([]*tpt.Region, 0, 4)
}

func (rs *responder) reset() {
	segs, regs := rs.rwqe.segs[:0], rs.rwqe.regs[:0]
	res := rs.res
	clear(res)
	*rs = responder{q: rs.q, order: rs.order, res: res}
	rs.rwqe.segs, rs.rwqe.regs = segs, regs
}

func (rs *responder) setResources(n int) {
	rs.res = make([]respResource, n)
	rs.resNext = 0
	rs.pend = rs.pend[:0]
}

func (rs *responder) pumping() bool { return len(rs.pend) > 0 }

// abort ends what the responder was doing (the QP is entering ERR): a receive WQE taken
// by a message in progress completes with WR_FLUSH_ERR, responses stop, and the mode drops
// its messages in progress.
func (rs *responder) abort() {
	q := rs.q
	if rs.haveRWQE {
		q.recvCQ.push(&CQE{WRID: rs.rwqe.wrID, QPN: q.qpn, Status: StatusWRFlushErr, Opcode: WCRecv, srq: q.srq})
		rs.haveRWQE = false
	}
	for _, i := range rs.pend {
		rs.res[i].queued = false
	}
	rs.pend = rs.pend[:0]
	rs.order.abort()
}

// remoteMem checks a remote access of n bytes at va with rkey: the QP must allow the
// kind of access and the key must grant it over the whole range (a zero-length access
// checks no key, as IBTA says). On failure the request is NAKed and the QP errors.
func (rs *responder) remoteMem(need tpt.Access, rkey uint32, va, n uint64, what string) ([]byte, *tpt.Region, bool) {
	q := rs.q
	if q.attr.Access&need == 0 {
		rs.respFatal(wire.NakRemoteAccessError, StatusRemAccessErr, VendorNoRights, "QP does not allow "+what)
		return nil, nil, false
	}
	if n == 0 {
		return nil, nil, true
	}
	reg := q.dev.mrs.Lookup(rkey)
	mem, st := reg.Check(q.pd, va, n, need)
	if st != tpt.OK {
		rs.respFatal(wire.NakRemoteAccessError, StatusRemAccessErr, localVendorErr(st), what+": "+st.String())
		return nil, nil, false
	}
	return mem, reg, true
}

// revoked ends the connection because the region a message in progress uses was
// deregistered (see Device.Quiesce): a remote access NAK for psn, the access error event,
// the QP to ERR.
func (rs *responder) revoked(psn wire.PSN, why string) {
	q := rs.q
	rs.sendNak(wire.AETHNak|wire.NakRemoteAccessError, psn)
	q.dev.raise(Event{Type: EventQPAccessErr, QP: q, Detail: why})
	q.errorState(StatusWRFlushErr, 0)
}

// addResource records an executed READ or atomic in the resource ring, moves the expected
// PSN past the npkts it uses and queues its responses (which acknowledge everything
// before it).
func (rs *responder) addResource(r respResource, npkts uint32) {
	i := rs.allocResource()
	rs.msn = (rs.msn + 1) & wire.PSNMask
	r.msn = rs.msn
	rs.res[i] = r
	rs.epsn = r.firstPSN.Add(npkts)
	rs.ackPending = false
	rs.queueResource(i)
}

// allocResource takes the next slot of the resource ring and returns its index.
func (rs *responder) allocResource() int {
	i := rs.resNext
	rs.resNext = (i + 1) % len(rs.res)
	// If the requester exceeded max_dest_rd_atomic, the oldest pending response is lost.
	rs.unqueueResource(i)
	return i
}

// unqueueResource takes resource i off the pump list before it is reused: its responses
// (a replay still being sent, round by round) must not continue with the new request's
// state.
func (rs *responder) unqueueResource(i int) {
	if !rs.res[i].queued {
		return
	}
	rs.res[i].queued = false
	for k, j := range rs.pend {
		if j == i {
			rs.pend = append(rs.pend[:k], rs.pend[k+1:]...)
			break
		}
	}
}

// queueResource puts resource i's responses on the pump list.
func (rs *responder) queueResource(i int) {
	q := rs.q
	if !rs.res[i].queued {
		rs.res[i].queued = true
		rs.pend = append(rs.pend, i)
	}
	q.home.queueResp(q)
}

// executeAtomic runs an atomic on the 8 bytes of mem — fetch-and-add of swapAdd, or
// compare-and-swap of swapAdd where the value equals compare — atomically with respect to
// the device's other atomics (ATOMIC_HCA), and returns the value before.
func (d *Device) executeAtomic(mem []byte, fetchAdd bool, swapAdd, compare uint64) uint64 {
	d.atomicMu.Lock()
	defer d.atomicMu.Unlock()
	orig := binary.NativeEndian.Uint64(mem)
	v := orig
	if fetchAdd {
		v = orig + swapAdd
	} else if orig == compare {
		v = swapAdd
	}
	binary.NativeEndian.PutUint64(mem, v)
	return orig
}

// requestAck notes that the packet asked for an acknowledgement. ACKs are coalesced to
// the end of the receive batch, except that a long run of packets is acknowledged at once:
// a batch can hold a whole window, and a requester waiting for the batch's end would stall.
func (rs *responder) requestAck(p *wire.Packet) {
	q := rs.q
	rs.sinceAck++
	if p.BTH.AckReq {
		rs.ackPending = true
		u := q.home
		if rs.sinceAck >= int(q.dev.winBase)/4 && !rs.pumping() && u.rxOut.Room(2, 64) {
			rs.sendAck(u.rxOut)
			u.flushNow = true
			return
		}
		u.queueAck(q)
	} else if rs.ackPending {
		q.home.queueAck(q)
	}
}

// pumpResponses sends pending READ responses and atomic ACKs into b, at most rs.budget
// packets. It returns false if b filled up or the budget ran out first.
func (rs *responder) pumpResponses(b *netio.SendBatch) bool {
	q := rs.q
	for len(rs.pend) > 0 {
		r := &rs.res[rs.pend[0]]
		for r.kind != resFree && !r.stop.Before(r.next) {
			if !b.Room(3, wire.MaxHeaderLen+16) || rs.budget <= 0 {
				return false
			}
			if r.kind == resRead && r.reg.Revoked() {
				// Deregistered since the request was checked (a replay of an old READ, or a
				// long one): not a byte more of it leaves.
				rs.revoked(r.next, "RDMA READ source deregistered")
				return true
			}
			rs.emitResponse(b, r)
			rs.budget--
		}
		r.queued = false
		rs.pend = append(rs.pend[:0], rs.pend[1:]...)
	}
	if rs.nakHeld && rs.nakPSN.Before(rs.epsn) {
		// The PSN it asks for has arrived and been taken since: the NAK is obsolete, and
		// would only make the requester send again what was received.
		rs.nakHeld = false
	}
	if rs.nakHeld {
		if !b.Room(2, 64) {
			return false
		}
		rs.nakHeld = false
		if wire.AETHKind(rs.nakSyn) == wire.AETHRNR {
			q.stats.RNRNAKsSent++
		} else {
			q.stats.NAKsSent++
		}
		rs.sendAETH(b, rs.nakSyn, rs.nakPSN)
	}
	if rs.ackPending {
		q.home.queueAck(q)
	}
	return true
}

// emitResponse sends r's response at r.next.
func (rs *responder) emitResponse(b *netio.SendBatch, r *respResource) {
	q := rs.q
	psn := r.next
	r.next = psn.Add(1)
	bth := wire.BTH{PKey: wire.DefaultPKey, DestQP: q.attr.DestQPN, PSN: psn}
	// The MSN as Linux rxe computes it: a READ's or atomic's own, counting it, even when
	// later requests of the same receive batch were executed before its responses leave; a
	// READ replayed for a duplicate request carries the current one (an atomic's replay
	// is the response it had).
	aeth := wire.AETH{Syndrome: wire.AETHAck | wire.NoCredits, MSN: r.msn}
	if r.kind == resRead && r.replay {
		aeth.MSN = rs.msn
	}
	if r.kind == resAtomic {
		bth.Opcode = wire.OpAtomicAcknowledge
		hdr := b.Alloc(wire.BTHLen + wire.AETHLen + wire.AtomicAckETHLen)
		bth.Put(hdr)
		aeth.Put(hdr[wire.BTHLen:])
		binary.BigEndian.PutUint64(hdr[wire.BTHLen+wire.AETHLen:], r.orig)
		q.emit(b, hdr, nil, 0)
		return
	}
	first, last := psn == r.start, psn == r.stop
	switch {
	case first && last:
		bth.Opcode = wire.OpReadResponseOnly
	case first:
		bth.Opcode = wire.OpReadResponseFirst
	case last:
		bth.Opcode = wire.OpReadResponseLast
	default:
		bth.Opcode = wire.OpReadResponseMiddle
	}
	off := uint64(psn.Diff(r.firstPSN)) * uint64(q.mtu)
	n := min(uint64(q.mtu), uint64(len(r.mem))-min(off, uint64(len(r.mem))))
	var pay [1][]byte
	pieces := pay[:0]
	if n > 0 {
		pieces = append(pieces, r.mem[off:off+n])
	}
	info := bth.Opcode.Info()
	hdr := b.Alloc(info.HdrLen)
	bth.PadCnt = uint8(wire.PadFor(int(n)))
	bth.Put(hdr)
	if info.Flags&wire.HasAETH != 0 {
		aeth.Put(hdr[wire.BTHLen:])
	}
	q.emit(b, hdr, pieces, int(n))
}

// sendAck sends the coalesced ACK for everything up to epsn-1.
func (rs *responder) sendAck(b *netio.SendBatch) {
	rs.ackPending, rs.ackDeferred = false, false
	rs.sinceAck = 0
	rs.sendAETH(b, wire.AETHAck|wire.NoCredits, rs.epsn.Add(wire.PSNMask))
}

// sendNak sends a NAK (or RNR NAK) for psn into the receive path's batch, after any
// responses still queued.
func (rs *responder) sendNak(syn uint8, psn wire.PSN) {
	q := rs.q
	if rs.pumping() && syn != wire.AETHNak|wire.NakInvalidRequest && syn != wire.AETHNak|wire.NakRemoteAccessError &&
		syn != wire.AETHNak|wire.NakRemoteOpError {
		rs.nakHeld, rs.nakSyn, rs.nakPSN = true, syn, psn
		return
	}
	if wire.AETHKind(syn) == wire.AETHRNR {
		q.stats.RNRNAKsSent++
	} else {
		q.stats.NAKsSent++
	}
	rs.ackPending = false
	rs.sendAETH(q.home.rxOut, syn, psn)
}

// sendAETH adds an ACK, NAK or RNR NAK (syndrome syn) for psn to b, in the mode's form.
func (rs *responder) sendAETH(b *netio.SendBatch, syn uint8, psn wire.PSN) {
	rs.order.ack(b, syn, psn)
}

// respFatal handles a request the responder cannot execute: it NAKs it, completes the
// receive WQE in use (if any) with status, or raises an async event, and moves the QP to
// ERR.
func (rs *responder) respFatal(nak uint8, status uint8, verr uint32, why string) {
	q := rs.q
	rs.sendNak(wire.AETHNak|nak, rs.epsn)
	if rs.haveRWQE {
		q.recvCQ.push(&CQE{WRID: rs.rwqe.wrID, QPN: q.qpn, Status: status, Opcode: WCRecv, VendorErr: verr, srq: q.srq})
		rs.haveRWQE = false
	} else {
		ev := EventQPReqErr
		switch nak {
		case wire.NakRemoteAccessError:
			ev = EventQPAccessErr
		case wire.NakRemoteOpError:
			ev = EventQPFatal
		}
		q.dev.raise(Event{Type: ev, QP: q, Detail: why})
	}
	q.errorState(StatusWRFlushErr, 0)
}

// respFatalEvent NAKs the request, raises the asynchronous event ev and moves the QP to
// ERR (a receive WQE in use is flushed with the rest).
func (rs *responder) respFatalEvent(nak uint8, status uint8, ev EventType, why string) {
	q := rs.q
	rs.sendNak(wire.AETHNak|nak, rs.epsn)
	q.dev.raise(Event{Type: ev, QP: q, Detail: why})
	q.errorState(StatusWRFlushErr, 0)
}

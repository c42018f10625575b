package transport

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/wire"
)

// ud is the unreliable-datagram service: every message is one packet (at most the MTU)
// to the QP and address its work request names, carrying a DETH with the Q_Key; nothing
// acknowledges it, so a send completes once it was handed to the socket, and a datagram
// that finds no receive WQE, or the wrong Q_Key, is dropped and counted. A receive buffer
// starts with the 40-byte GRH area (the IP header of the datagram, as libibverbs gives
// it for RoCEv2), then the payload.
type ud struct{}

// GRHLen is the size of the GRH area at the start of a UD receive buffer.
const GRHLen = 40

func (ud) weak() bool { return false }

// Responder.

func (ud) acceptsFrom(*QP, netip.AddrPort) bool       { return true }
func (ud) accepts(f uint32) bool                      { return f&wire.IsUD != 0 }
func (ud) ack(*QP, *netio.SendBatch, uint8, wire.PSN) {}
func (ud) usage(*QP) (u [NumLimits]uint32)            { return u }
func (ud) flushTaken(*QP)                             {}
func (ud) response(q *QP, _ *wire.Packet)             { q.stats.WrongMode++ } // nothing answers a datagram

// request receives a datagram: Q_Key check, one receive WQE, GRH and payload placed, a
// completion that names the sender's QP.
func (ud) directTarget(*QP, *wire.Packet) []byte { return nil }
func (ud) request(q *QP, p *wire.Packet) {
	if p.DETH.QKey != q.attr.QKey {
		q.stats.QKeyErrors++
		return
	}
	rs := &q.resp
	w := &rs.rwqe
	if !q.rq.pop(w) {
		q.stats.Dropped++ // no receive WQE: a datagram is not retried
		return
	}
	if q.srq {
		q.srqTaken++
	}
	e := CQE{WRID: w.wrID, QPN: q.qpn, SrcQP: p.DETH.SrcQP, SrcPort: q.home.rxFrom.Port(), Opcode: WCRecv, srq: q.srq, solicited: p.BTH.SE}
	n := GRHLen + len(p.Payload)
	switch {
	case w.verr != 0:
		e.Status, e.VendorErr = StatusLocProtErr, w.verr
	case w.revoked():
		e.Status, e.VendorErr = StatusLocProtErr, VendorRevoked
	case uint64(n) > w.length:
		e.Status, e.VendorErr = StatusLocLenErr, VendorLength
	default:
		var grh [GRHLen]byte
		putGRH(grh[:], q.home.rxFrom.Addr(), q.dev.local.Addr(), len(p.Payload))
		scatter(w.segs, 0, grh[:])
		scatter(w.segs, GRHLen, p.Payload)
		e.ByteLen, e.Flags = uint32(n), WCFlagGRH
		if p.Info.Flags&wire.HasImmDt != 0 {
			e.Imm, e.Flags = p.Imm, e.Flags|WCFlagWithImm
		}
	}
	clear(w.segs)
	clear(w.regs)
	q.recvCQ.push(&e)
	if e.Status != StatusSuccess {
		// A local error on a receive moves the QP to ERR, as for RC.
		q.errorState(StatusWRFlushErr, 0)
	}
}

// putGRH writes the GRH area of a datagram of n payload bytes from src to dst: for IPv4 the
// IPv4 header in its last 20 bytes (the first 20 zero), for IPv6 the IPv6 header, as a
// RoCEv2 device gives it.
func putGRH(b []byte, src, dst netip.Addr, n int) {
	clear(b[:GRHLen])
	udpLen := 8 + wire.BTHLen + wire.DETHLen + n + wire.ICRCLen
	if src.Is4() || src.Is4In6() {
		h := b[20:]
		h[0] = 0x45
		binary.BigEndian.PutUint16(h[2:], uint16(20+udpLen))
		h[6] = 0x40 // DF
		h[8] = 64
		h[9] = 17
		s, d := src.Unmap().As4(), dst.Unmap().As4()
		copy(h[12:16], s[:])
		copy(h[16:20], d[:])
		var sum uint32
		for i := 0; i < 20; i += 2 {
			sum += uint32(binary.BigEndian.Uint16(h[i:]))
		}
		for sum > 0xFFFF {
			sum = sum&0xFFFF + sum>>16
		}
		binary.BigEndian.PutUint16(h[10:], ^uint16(sum))
		return
	}
	b[0] = 0x60
	binary.BigEndian.PutUint16(b[4:], uint16(udpLen))
	b[6] = 17
	b[7] = 64
	s, d := src.As16(), dst.As16()
	copy(b[8:24], s[:])
	copy(b[24:40], d[:])
}

// GRHSource returns the source address a GRH area holds (see putGRH).
func GRHSource(grh []byte) (netip.Addr, bool) {
	if len(grh) < GRHLen {
		return netip.Addr{}, false
	}
	if grh[20]>>4 == 4 {
		zero := true
		for _, c := range grh[:20] {
			zero = zero && c == 0
		}
		if zero {
			return netip.AddrFrom4([4]byte(grh[32:36])), true
		}
	}
	if grh[0]>>4 == 6 {
		return netip.AddrFrom16([16]byte(grh[8:24])), true
	}
	return netip.Addr{}, false
}

// Requester.

// errUDOp and friends say why a UD work request was refused.
var errUDNoAH = errors.New("a UD work request needs an address handle")

func (ud) checkPost(q *QP, op uint8, hasAH bool, remoteQPN uint32, length uint64) error {
	switch {
	case op != WRSend && op != WRSendImm:
		return fmt.Errorf("opcode %d is not supported on a UD QP (SEND and SEND with immediate are)", op)
	case !hasAH:
		return errUDNoAH
	case remoteQPN > wire.PSNMask:
		return fmt.Errorf("remote QPN %#x does not fit 24 bits", remoteQPN)
	case length > uint64(q.mtu):
		return fmt.Errorf("a UD message of %d bytes exceeds the MTU of %d", length, q.mtu)
	}
	return nil
}

func (ud) startRequester(*QP, wire.PSN)                   {}
func (ud) window(*QP) int32                               { return 1 << 22 }
func (ud) beforeFill(*QP, *netio.SendBatch) (int64, bool) { return 0, false }
func (ud) afterFill(*QP, int64)                           {}
func (ud) start(*QP, *sendWQE)                            {}
func (ud) admit(*QP, *sendWQE, wire.PSN, wire.PSN) bool   { return true }
func (ud) readSlot(*QP, *sendWQE, wire.PSN) bool          { return true }
func (ud) rtoShift() uint8                                { return 0 }
func (ud) onTimer(*QP, int64) bool                        { return false }
func (ud) probeDue(int64) bool                            { return false }
func (ud) resend(*QP, wire.PSN, bool)                     {}
func (ud) holeCounts() (opened, closed uint64)            { return 0, 0 }
func (ud) holes() Holes                                   { return Holes{} }

func (ud) format(_ *QP, w *sendWQE, _ uint32, _ bool, _, _ uint64) (wire.Opcode, wire.OOH, bool, bool) {
	if w.op == WRSendImm {
		return wire.OpUDSendOnlyImm, wire.OOH{}, false, false
	}
	return wire.OpUDSendOnly, wire.OOH{}, false, false
}

// sent: nothing will acknowledge the datagram, so its PSN is done at once.
func (ud) sent(q *QP, _ uint64, _ *sendWQE, _, next wire.PSN, _ int64) { q.req.una = next }

// transmitted completes the sends handed to the socket, in order.
func (ud) transmitted(q *QP) {
	for q.sq.sentUncompleted() {
		q.comp.completeSend(q.sq.oldest())
	}
}

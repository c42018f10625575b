package transport

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/tpt"
	"github.com/softrnic/softrnic/internal/wire"
)

// udService is the unreliable-datagram service: every message is one packet (at most the
// MTU) to the QP and address its work request names, carrying a DETH with the Q_Key;
// nothing acknowledges it, so a send completes once it was handed to the socket, and a
// datagram that finds no receive WQE, or the wrong Q_Key, is dropped and counted. A
// receive buffer starts with the 40-byte GRH area (the IP header of the datagram, as
// libibverbs gives it for RoCEv2), then the payload. It has none of RC's roles: it sends
// what is posted as it comes, and places what arrives.
type udService struct {
	q       *QP
	nextPSN wire.PSN // PSN of the next datagram
	sentPSN wire.PSN // one past the PSN of the last datagram built
	rwqe    recvWQE  // the receive WQE of the datagram being placed
}

// GRHLen is the size of the GRH area at the start of a UD receive buffer.
const GRHLen = 40

func newUDService(q *QP) *udService {
	u := &udService{q: q}
	u.rwqe.segs = make([][]byte, 0, 4)
	u.rwqe.regs = make([]*tpt.Region, 0, 4)
	return u
}

// from: datagrams come from anyone.
func (*udService) from(netip.AddrPort) bool { return true }

// response: nothing answers a datagram. (A response is counted as an RC QP counts one: a
// PSN never sent is dropped, any other is of the wrong service.)
func (u *udService) response(p *wire.Packet) {
	if !p.BTH.PSN.Before(u.sentPSN) {
		u.q.stats.Dropped++
		return
	}
	u.q.stats.WrongMode++
}

// request receives a datagram: Q_Key check, one receive WQE, GRH and payload placed, a
// completion that names the sender's QP.
func (u *udService) request(p *wire.Packet) {
	q := u.q
	if p.Info.Flags&wire.IsUD == 0 {
		q.stats.WrongMode++ // an RC request (see rc.request)
		return
	}
	if p.DETH.QKey != q.attr.QKey {
		q.stats.QKeyErrors++
		return
	}
	w := &u.rwqe
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

// errUDNoAH says why a UD work request without an address handle was refused.
var errUDNoAH = errors.New("a UD work request needs an address handle")

// checkPost: SEND only, to an address handle and a 24-bit QP number, in one packet.
func (u *udService) checkPost(op uint8, hasAH bool, remoteQPN uint32, length uint64) error {
	q := u.q
	switch {
	case op != WRSend && op != WRSendImm:
		return fmt.Errorf("%s is not supported on a UD QP (SEND and SEND_WITH_IMM are)", WROpName(op))
	case !hasAH:
		return errUDNoAH
	case remoteQPN > wire.PSNMask:
		return fmt.Errorf("remote QPN %#x does not fit 24 bits", remoteQPN)
	case length > uint64(q.mtu):
		return fmt.Errorf("a UD message of %d bytes exceeds the MTU of %d", length, q.mtu)
	}
	return nil
}

// begin: the first datagram's PSN (each datagram takes the next).
func (u *udService) begin(psn wire.PSN) { u.nextPSN, u.sentPSN = psn, psn }

// fill builds a datagram for each WQE posted, in order, into b. A WQE that failed its
// local checks at post time fails the QP once the datagrams before it have completed; in
// SQD no new WQE starts.
func (u *udService) fill(b *netio.SendBatch) bool {
	q := u.q
	if q.state != StateRTS && q.state != StateSQD {
		return false
	}
	for q.sq.unsent() {
		w := q.sq.current()
		if q.sq.fresh() {
			if q.state == StateSQD {
				return false
			}
			if w.verr != 0 {
				if q.sq.atOldest() {
					q.errorState(StatusLocProtErr, w.verr)
				}
				return false
			}
			w.firstPSN, w.npkts = u.nextPSN, 1
			u.nextPSN = u.nextPSN.Add(1)
			q.sq.start()
		}
		if !b.Room(maxPieces+2, wire.MaxHeaderLen+wire.OOHLen+16) {
			return true
		}
		u.build(b, w)
		u.sentPSN = w.firstPSN.Add(1)
		q.sq.next()
	}
	return false
}

// build emits w's datagram into b: BTH, DETH (the Q_Key and this QP), the immediate if
// any, the payload, to the address handle's destination.
func (u *udService) build(b *netio.SendBatch, w *sendWQE) {
	q := u.q
	bth := wire.BTH{Opcode: wire.OpUDSendOnly, PKey: wire.DefaultPKey, DestQP: w.remoteQPN, PSN: w.firstPSN,
		SE: w.flags&FlagSolicited != 0}
	if w.op == WRSendImm {
		bth.Opcode = wire.OpUDSendOnlyImm
	}
	info := bth.Opcode.Info()
	hdr := b.Alloc(info.HdrLen)
	deth := wire.DETH{QKey: w.qkey, SrcQP: q.qpn}
	deth.Put(hdr[wire.BTHLen:])
	if info.Flags&wire.HasImmDt != 0 {
		binary.BigEndian.PutUint32(hdr[wire.BTHLen+wire.DETHLen:], w.imm)
	}
	var pieces [maxPieces][]byte
	n := int(w.length) // at most the MTU (checkPost)
	pay := gather(w.segs, 0, n, pieces[:0])
	bth.PadCnt = uint8(wire.PadFor(n))
	bth.Put(hdr)
	q.emitTo(b, &w.ah.addr, &w.ah.flow, 0, hdr, pay, n)
}

// transmitted completes the sends handed to the socket, in order.
func (u *udService) transmitted() {
	q := u.q
	for q.sq.sentUncompleted() {
		q.comp.completeSend(q.sq.oldest())
	}
}

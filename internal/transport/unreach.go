package transport

import (
	"encoding/binary"
	"net/netip"

	"github.com/softrnic/softrnic/internal/wire"
)

// A peer whose port is closed.
//
// On Linux the device's sockets hear when the host of a destination answers a datagram
// with ICMP port unreachable: no socket is bound to the UDP port there, so no device runs
// at that address (netio.Config.Unreachable). An RC QP with requests outstanding to that
// peer would spend its whole retry budget (RetryCnt local ACK timeouts) on the silence and
// then fail with RETRY_EXC_ERR; given the report, it fails at once with the same status,
// which is what a NIC gives for a peer it cannot reach, and VendorUnreachable. A UD
// datagram's report goes to Device.OnUnreachable (the CM's requests, sent on QP1).
//
// A report is a hint: an ICMP message is easily forged. It fails a QP only if it quotes a
// request that QP sent and that is not acknowledged yet: the quoted datagram went to the
// QP's peer address and port, its BTH names the peer's QP and a PSN between the oldest
// unacknowledged one and the highest sent, and the QP is in RTS or SQD with work in
// flight. A forger off the path would have to guess a 24-bit PSN within the window as well
// as both QP numbers; one on the path sees them, but can equally drop the QP's packets,
// which fails it the same way after the retries. So a forged report costs at most what a
// retry-exhausted failure costs, only sooner, and never touches a QP with nothing
// outstanding, nor one whose last requests were all acknowledged. A report that quotes too
// little to show the BTH (a host other than Linux may quote only the UDP header) is
// ignored: the QP keeps its retries.

// VendorUnreachable is the vendor error of a RETRY_EXC_ERR completion whose QP failed
// because its peer's host reported the peer's UDP port closed (ICMP port unreachable),
// before its retries ran out.
const VendorUnreachable uint32 = 0x32

// portUnreachable handles a report that dst's host answered a datagram the device sent
// with ICMP port unreachable, quote being what it quotes of the datagram (a receive path,
// its rxMu held).
func (d *Device) portUnreachable(dst netip.AddrPort, quote []byte) {
	if d.closed.Load() || len(quote) < wire.BTHLen {
		return
	}
	op := wire.Opcode(quote[0])
	info := op.Info()
	destQP := binary.BigEndian.Uint32(quote[4:8]) & 0xFFFFFF
	switch {
	case !info.Valid || info.Flags&wire.IsRequest == 0:
		// An ACK or a response: the peer's requester is gone too, but this side has
		// nothing outstanding that the report could end.
	case info.Flags&wire.IsUD != 0:
		if d.OnUnreachable != nil && len(quote) >= info.HdrLen {
			d.OnUnreachable(dst, destQP, quote[info.HdrLen:])
		}
	default:
		psn := wire.PSN(binary.BigEndian.Uint32(quote[8:12]) & uint32(wire.PSNMask))
		for _, q := range d.peerQPs(dst) {
			q.mu.Lock()
			if q.sentUnacked(dst, destQP, psn) {
				q.stats.Unreachable++
				q.errorState(StatusRetryExcErr, VendorUnreachable)
			}
			q.mu.Unlock()
		}
	}
}

// peerQPs returns the RC QPs connected to dst (a fresh slice: the reports are rare).
func (d *Device) peerQPs(dst netip.AddrPort) []*QP {
	var qs []*QP
	d.qpMu.Lock()
	for q := range d.qpSet {
		if q.service == ServiceRC {
			qs = append(qs, q)
		}
	}
	d.qpMu.Unlock()
	kept := qs[:0]
	for _, q := range qs {
		q.mu.Lock()
		if q.peer != nil && q.peer.AP == dst {
			kept = append(kept, q)
		}
		q.mu.Unlock()
	}
	return kept
}

// sentUnacked reports whether the request packet with PSN psn to peer QP destQP at dst is
// one q sent and the peer has not acknowledged, with q in a state that has work in flight
// (q.mu held).
func (q *QP) sentUnacked(dst netip.AddrPort, destQP uint32, psn wire.PSN) bool {
	if q.destroyed || (q.state != StateRTS && q.state != StateSQD) || q.peer == nil || q.peer.AP != dst ||
		q.attr.DestQPN != destQP || !q.sq.inFlight() {
		return false
	}
	r := &q.req
	return !psn.Before(r.una) && psn.Before(r.highPSN)
}

package transport

import (
	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/wire"
)

// Putting a QP's packets on the wire: emit completes a packet (padding, ICRC) into a batch;
// transmit ownership (see the package doc) makes one goroutine at a time build and send
// the QP's requests without holding QP.mu across the send.

// gather appends to dst the pieces of segs that hold bytes [off, off+n).
func gather(segs [][]byte, off uint64, n int, dst [][]byte) [][]byte {
	for _, s := range segs {
		if n == 0 {
			break
		}
		l := uint64(len(s))
		if off >= l {
			off -= l
			continue
		}
		k := min(uint64(n), l-off)
		dst = append(dst, s[off:off+k])
		n -= int(k)
		off = 0
	}
	return dst
}

// emit completes a packet to the QP's peer: pad, ICRC, and appends it to b.
func (q *QP) emit(b *netio.SendBatch, hdr []byte, pay [][]byte, payLen int) {
	q.emitTo(b, q.peer, &q.txFlow, q.src, hdr, pay, payLen)
}

// emitTo completes a packet to addr, whose flow the ICRC covers, and appends it to b.
func (q *QP) emitTo(b *netio.SendBatch, addr *netio.Addr, flow *wire.Flow, src int, hdr []byte, pay [][]byte, payLen int) {
	wire.SetMigReq(hdr)
	pad := wire.PadFor(payLen)
	trailer := b.Alloc(pad + wire.ICRCLen)
	clear(trailer[:pad])
	wire.PutICRC(trailer[pad:], flow.ICRCPartsCached(&q.txPrefix, hdr, pay, trailer[:pad]))
	b.BeginFrom(addr, src)
	b.Add(hdr)
	for _, p := range pay {
		b.Add(p)
	}
	b.Add(trailer)
	b.End()
	q.stats.TxPackets++
	q.stats.TxBytes += uint64(len(hdr) + payLen + len(trailer))
	if bare := q.dev.bare; bare != nil {
		bare.emitted(addr.AP, hdr, pay, trailer)
	}
}

// send hands the datagrams of b to the device's socket and resets b. (A device without
// sockets drops them: its test captured each as it was emitted.)
func (d *Device) send(b *netio.SendBatch) {
	if d.bare != nil {
		b.Reset()
		return
	}
	_ = d.conn.Send(b)
}

// pushTxUnlock builds and sends the QP's pending requests in the calling goroutine, unless
// another goroutine owns transmission (which then picks the work up). Called with q.mu
// held; returns with it released. The lock is never held across the send system call.
func (q *QP) pushTxUnlock() {
	if q.txOwner {
		q.txPending = true
		q.mu.Unlock()
		return
	}
	q.txOwner = true
	d := q.dev
	b := d.getBatch()
	for {
		q.txPending = false
		full := q.svc.fill(b)
		q.mu.Unlock()
		if b.Len() > 0 {
			d.send(b)
		}
		q.mu.Lock()
		q.svc.transmitted()
		if !full && !q.txPending {
			break
		}
	}
	q.releaseTx()
	q.mu.Unlock()
	d.putBatch(b)
}

// releaseTx gives up transmit ownership, waking a Destroy that waits for it (q.mu held).
func (q *QP) releaseTx() {
	q.txOwner = false
	if q.destroyed {
		q.txIdle.Broadcast()
	}
}

// sourceFor picks the device socket (netio source) a QP's packets leave from, out of n:
// RoCEv2 takes the UDP source port as a flow's entropy, one per QP, so that ECMP and
// receive-side steering spread QPs. Only a QP that takes its peer's packets from any
// source port (PeerSrcPort 0: a standard RoCEv2 peer, which takes any port in turn) sends
// from one of the extra sockets, chosen by its number; one that pins its peer's port (a
// softrnic peer, which pins this device's port in turn) sends from the device's own
// socket (0).
func sourceFor(qpn uint32, n int) int {
	if n <= 1 {
		return 0
	}
	h := qpn * 0x9E3779B1 // spread consecutive numbers
	return 1 + int(h>>16)%(n-1)
}

// SourcePort is the UDP port the QP's packets leave from.
func (q *QP) SourcePort() uint16 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.dev.conn.SourcePort(q.src)
}

package msg

import (
	"fmt"
	"time"

	"github.com/softrnic/softrnic/verbs"
)

// The eager path. Each direction of a connection has a ring of Config.Slots slots in the
// receiver's memory, registered for remote writes, into which the sender writes its
// messages and control messages (rendezvous RTS, CTS and FIN, an enlargement request)
// slot after slot. It copies each into one of its staging buffers (Config.SendSlots of
// them) and posts an RDMA WRITE with immediate data from there into the next slot: an
// eager send is complete, and its buffer the caller's again, once copied. The immediate
// data names the slot and carries credits for the other direction; its completion on
// the receiver, from the rank's shared receive queue of zero-length receives, is what
// tells the receiver that the slot is full: it never polls the ring's memory, whose bytes
// may land in any order in weakly-ordered mode. The receiver handles the slots in the
// order they were written, and a slot is free again once its message is copied out (into
// the matching receive, or kept as unexpected).
//
// Credits keep the sender from overwriting a slot not yet handled: it starts with one
// per slot of the peer's ring and spends one per write. The receiver gives them back for
// the slots it has handled in the immediate data of its own writes to the sender or,
// once it owes half a ring, in a zero-length WRITE with immediate data of their own.
// Credits carry the generation of the ring they are for, so that those given for a ring
// an enlargement replaced are ignored.

// writeSlot copies an element into a staging buffer and writes it into the peer's next
// slot with immediate data (and the credits we owe).
func (p *peer) writeSlot(m *outMsg) {
	c := p.c
	idx := p.stageFree[len(p.stageFree)-1]
	p.stageFree = p.stageFree[:len(p.stageFree)-1]
	buf := p.stage.Buf()[idx*p.rSize : (idx+1)*p.rSize]
	h := header{Kind: m.kind, Src: uint32(c.rank)}
	var payload []byte
	switch m.kind {
	case kindData:
		r := m.req
		r.started = true
		h.Tag, h.Ctx, h.Len, h.Total = int32(r.tag), r.ctx, uint32(len(r.buf)), uint64(len(r.buf))
		payload = r.buf
		c.stats.EagerSent++
	case kindRTS:
		r := m.req
		r.started = true
		c.nextID++
		r.id = c.nextID
		p.inflight[r.id] = r
		c.transfers++
		h.Tag, h.Ctx, h.Total, h.ID = int32(r.tag), r.ctx, uint64(len(r.buf)), r.id
		c.stats.RendezvousSent++
	case kindCTS:
		r := m.req
		h.ID, h.Total = r.rndvID, uint64(len(r.buf))
		if r.pinned != nil {
			h.Addr, h.RKey = r.pinned.addr(r.buf), r.pinned.mr.RKey()
		}
	case kindFIN:
		h.ID = m.id
	case kindEnlarge:
		h.Phase, h.ID, h.Addr = uint8(p.target), uint64(p.ackNonce), uint64(p.ackSlot)
	}
	h.put(buf)
	copy(buf[hdrLen:], payload)
	slot := int(p.sendSeq % uint64(p.rSlots))
	credits := min(p.owed, maxCredits)
	p.owed -= credits
	p.sge[0] = p.stage.SGE(idx*p.rSize, hdrLen+len(payload))
	p.wr[0] = verbs.SendWR{WRID: wrStage | uint64(p.stageGen&0xFF)<<32 | uint64(idx), Opcode: verbs.WRRDMAWriteWithImm, SendFlags: verbs.SendSignaled,
		SGList: p.sge[:], RemoteAddr: p.rAddr + uint64(slot*p.rSize), RKey: p.rKey, ImmData: imm(immSlot, p.gen, credits, slot)}
	err := p.qp.PostSend(p.wr[:])
	if err != nil {
		p.down(err)
		return
	}
	p.sqUsed++
	p.credits--
	p.sendSeq++
	if p.firstSend {
		p.firstSend = false
		c.lab.LastEnlargement.ToFirstSend = time.Since(p.ctlAt)
	}
	if m.kind == kindData {
		m.req.complete(nil) // copied: the buffer is the caller's again
	}
}

// postImm posts a zero-length WRITE with immediate data (credits, notifications).
func (p *peer) postImm(wrid uint64, v uint32) {
	p.wr[0] = verbs.SendWR{WRID: wrid, Opcode: verbs.WRRDMAWriteWithImm, SendFlags: verbs.SendSignaled,
		RemoteAddr: p.rAddr, RKey: p.rKey, ImmData: v}
	err := p.qp.PostSend(p.wr[:])
	if err != nil {
		p.down(err)
		return
	}
	p.sqUsed++
}

// onImm handles a WRITE with immediate from the peer.
func (p *peer) onImm(v uint32) {
	c := p.c
	kind, gen, credits, slot := immParts(v)
	if credits > 0 && gen == p.rGen&3 {
		p.credits = min(p.credits+credits, p.rSlots) // a peer cannot grant more slots than its ring has
		c.activate(p)
	}
	switch kind {
	case immSlot:
		if p.ring == nil || slot != int(p.recvSeq%uint64(c.cfg.Slots)) {
			p.down(fmt.Errorf("protocol: slot %d written, %d expected", slot, p.recvSeq%uint64(c.cfg.Slots)))
			return
		}
		size := c.cfg.Phases[p.phase]
		b := p.ring.Buf()[slot*size : (slot+1)*size]
		var h header
		h.get(b)
		p.recvSeq++
		if int(h.Len) > size-hdrLen {
			p.down(fmt.Errorf("protocol: a slot of %d bytes claims %d", size, h.Len))
			return
		}
		p.onSlot(&h, b[hdrLen:hdrLen+int(h.Len)])
	case immAckNotify:
		if slot == p.ackSlot {
			p.ackNotified = true // the write into the slot we read next has landed
		}
		c.activate(p)
	case immAckResend:
		if p.lastAck != nil {
			p.lastAckSlot = slot % ackSlots
			p.writeAck(p.lastAck, p.lastAckSlot)
		}
	}
}

// onSlot handles the message in a slot; the slot is free again when it returns.
func (p *peer) onSlot(h *header, payload []byte) {
	c := p.c
	switch h.Kind {
	case kindData:
		c.stats.EagerReceived++
		c.arrived(inMsg{src: p.rank, tag: int(h.Tag), ctx: h.Ctx, data: payload, total: int(h.Len)})
	case kindRTS:
		if h.Total > maxRendezvous {
			p.down(fmt.Errorf("protocol: a rendezvous message of %d bytes", h.Total))
			return
		}
		c.arrived(inMsg{src: p.rank, tag: int(h.Tag), ctx: h.Ctx, rndv: true, total: int(h.Total), id: h.ID})
	case kindCTS:
		p.onCTS(h)
	case kindFIN:
		p.onFIN(h.ID)
	case kindEnlarge:
		p.lastAckSlot = int(h.Addr % ackSlots)
		p.serveEnlarge(int(h.Phase), uint32(h.ID))
		return // the old ring is gone: no credit for its slot
	default:
		p.down(fmt.Errorf("protocol: slot of kind %d", h.Kind))
		return
	}
	p.owed++
	if p.owed >= p.creditBatch() {
		c.activate(p)
	}
}

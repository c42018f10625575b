package msg

import (
	"time"

	"github.com/softrnic/softrnic/verbs"
)

// The enlargement's acknowledgement: how the receiver tells the sender where its new ring
// is, and how the sender makes sure it read all of it.
//
// Every connection registers a small acknowledgement area, which the peer learns from the
// connection's private data. The receiver of an enlargement writes its acknowledgement
// (wire.go: the nonce as head flag, the new ring, a CRC-32, the nonce as tail flag) into
// a slot of the sender's area with one RDMA WRITE with immediate data; the immediate is the
// notification that the slot was written. The sender reads the slot only after that
// notification's completion and takes the acknowledgement only if both flags carry its
// request's nonce and the CRC matches, so a partial, stale or corrupt one leaves it
// waiting. If none is complete after Config.AckTimeout, the sender asks the receiver to
// write it again into the next slot of the area (the receiver keeps its last
// acknowledgement for that), then waits twice as long, and so on, as long as the area has
// a slot not yet used for this enlargement.

// The acknowledgement area: ackSlots slots, each written at most once per request (a
// resend asks for the next slot), so that a slot is read only after the WRITE into it
// completed and no other WRITE can be landing in it; then the staging of our own
// outgoing acknowledgements.
const (
	ackSlots   = 4
	ackSlotLen = 64
	ackOut     = ackSlots * ackSlotLen
	ackAreaLen = ackOut + ackSlotLen
)

var _ = [1]int{}[ackLen/(ackSlotLen+1)] // an acknowledgement fits a slot

// pollAck looks at the acknowledgement area for the enlargement asked for: complete,
// partial (the head flag without the tail, or a bad CRC: poll again), or nothing. Without a complete one
// after AckTimeout it asks the peer to write it again.
func (p *peer) pollAck() bool {
	c := p.c
	if !p.ackNotified {
		// Nothing was written since we last looked. The area is read only after the
		// notification's completion: until then a remote WRITE may be changing it (in
		// weakly-ordered mode its bytes land in any order), which Go's memory model
		// calls a race; the completion orders the WRITE before the read.
		if p.ackOverdue() {
			p.askAck()
		}
		return false
	}
	p.ackNotified = false
	a, st := readAck(p.ackMR.Buf()[p.ackSlot*ackSlotLen:][:ackLen], p.ackNonce)
	if st == ackComplete {
		phase := int(a.Phase)
		if phase == p.target && phase < len(c.cfg.Phases) && int(a.SlotSize) == c.cfg.Phases[phase] && a.Slots >= 2 && a.Slots <= maxCredits {
			p.ack, p.ackNotified = a, true // provisionLarge may have to wait: keep it
			c.lab.LastEnlargement.AckWait = time.Since(p.ctlAt)
			return true
		}
		st = ackPartial // not what was asked: as good as corrupt
	}
	if st == ackPartial {
		c.lab.AckPartialSeen++
	}
	if p.ackOverdue() {
		p.askAck()
	}
	return false
}

// ackOverdue reports whether to ask for the acknowledgement again: AckTimeout after the
// request, twice that after the first resend, and so on, and only while a slot of the
// area not asked for in this enlargement is left (a slot is read after its own
// notification; a write asked for earlier may still land in a slot used before).
func (p *peer) ackOverdue() bool {
	return p.ackAsks < ackSlots-1 && p.sqUsed < sqDepth && time.Since(p.ackSince) >= p.c.cfg.AckTimeout<<p.ackAsks
}

// askAck asks the peer to write its acknowledgement again.
func (p *peer) askAck() {
	p.ackSlot = (p.ackSlot + 1) % ackSlots // a fresh slot: no earlier write can still be landing in it
	p.ackNotified = false
	p.postImm(wrNotify, imm(immAckResend, p.gen, 0, p.ackSlot))
	p.ackSince = time.Now()
	p.ackAsks++
	p.c.stats.AckResends++
}

// writeAck writes an acknowledgement into the sender's area and notifies it.
func (p *peer) writeAck(b []byte, slot int) {
	c := p.c
	if !p.known {
		p.ackDeferred = true // our Dial returned, its answer is on the way to this goroutine
		return
	}
	if p.ackBusy {
		// The staging of the last one may still be read by a retransmission: write
		// this one when that WRITE completes.
		p.ackPending, p.lastAckSlot = true, slot
		return
	}
	if c.cfg.hooks != nil && c.cfg.hooks.ack != nil {
		if b = c.cfg.hooks.ack(p.rank, append([]byte(nil), b...)); b == nil {
			return // the test lost it
		}
	}
	p.ackBusy = true
	out := p.ackMR.Buf()[ackOut : ackOut+len(b)]
	copy(out, b)
	// One WRITE with immediate: the acknowledgement lands in the slot, and its immediate
	// data is the notification the sender reads the slot after (its completion orders the
	// write before the read).
	p.sge[0] = p.ackMR.SGE(ackOut, len(b))
	p.wr[0] = verbs.SendWR{WRID: wrAck, Opcode: verbs.WRRDMAWriteWithImm, SendFlags: verbs.SendSignaled, SGList: p.sge[:],
		RemoteAddr: p.pAck + uint64(slot*ackSlotLen), RKey: p.pAckKey, ImmData: imm(immAckNotify, p.gen, 0, slot)}
	if err := p.qp.PostSend(p.wr[:]); err != nil {
		p.down(err)
		return
	}
	p.sqUsed++
}

package msg

import (
	"fmt"
	"time"

	"github.com/softrnic/softrnic/verbs"
)

// transfer is seed 004's send routine (its Figures 3 and 5) over the connection's send
// vector: it returns how many elements it handed to the transport, 0 when it is waiting
// (for the peer's acknowledgement, credits, or staging room), and never blocks.
func (p *peer) transfer() (sent int) {
	c := p.c
	if p.ctlSent { // block 334: the control message was sent before
		if !p.pollAck() { // block 348: no complete acknowledgement yet
			c.stats.ZeroByteReports++ // block 350: tell the upper level nothing went
			return 0
		}
		if !p.provisionLarge() { // block 354 (Figure 4)
			c.stats.ZeroByteReports++
			return 0
		}
	}
	// Figure 5: the elements of the vector, one by one, against the threshold of the
	// slots in use; the prefix that fits goes now.
	n := 0
	for i, m := range p.sendQ {
		if m.size() > c.cfg.threshold(p.rPhase) { // block 566
			if i == 0 { // block 572: the first element does not fit
				p.useLarge = true // block 574
				p.target = c.cfg.phaseFor(m.size())
			}
			break // a later one: the prefix goes now, the rest after enlargement
		}
		n++
	}
	if n == 0 { // block 576 -> 344: ask the receiver to provision larger slots
		if p.useLarge && p.credits > 0 && len(p.stageFree) > 0 && p.sqUsed < sqDepth {
			c.nonce++
			if c.nonce == 0 {
				c.nonce++
			}
			p.ackNonce = c.nonce
			p.ctlAt = time.Now()
			p.writeSlot(&outMsg{kind: kindEnlarge})                                      // through the small slots
			p.ctlSent, p.ackSince, p.ackNotified, p.ackAsks = true, time.Now(), false, 0 // record that it was sent
			c.stats.Enlargements++
		}
		c.stats.ZeroByteReports++ // and report 0 bytes to the upper level
		return 0
	}
	if n < len(p.sendQ) && !p.useLarge {
		c.stats.PrefixSends++ // a later element is too large: it waits for the enlargement
		p.useLarge = true
		p.target = c.cfg.phaseFor(p.sendQ[n].size())
	}
	// Block 340 (or 356 after enlargement): the prefix, as credits and staging allow.
	for n > 0 && p.credits > 0 && len(p.stageFree) > 0 && p.sqUsed < sqDepth {
		m := p.sendQ.pop()
		n--
		p.writeSlot(&m)
		sent++
	}
	return sent
}

// serveEnlarge is seed 004's Figure 6 on the receiver: the control message arrived
// (block 681, without blocking other work: it is handled like any slot); the small ring
// is unregistered and freed and the larger one allocated and registered (682); the
// connection uses it (683); the acknowledgement, with its address and remote key framed
// by head and tail flags, goes to the sender (684).
func (p *peer) serveEnlarge(phase int, nonce uint32) {
	c := p.c
	if phase <= p.phase || phase >= len(c.cfg.Phases) {
		p.down(fmt.Errorf("protocol: enlargement from phase %d to %d", p.phase, phase))
		return
	}
	start := time.Now()
	c.deregBuf(p.ring)
	p.ring = nil
	mr, err := c.regBuf(c.cfg.Slots*c.cfg.Phases[phase], verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		p.down(err)
		return
	}
	p.ring, p.phase = mr, phase
	p.gen++
	posting := time.Now()
	c.stats.LastEnlargement.Serve = posting.Sub(start)
	p.recvSeq, p.owed = 0, 0
	a := ack{Nonce: nonce, Addr: mr.Addr(), RKey: mr.RKey(), Slots: uint32(c.cfg.Slots), SlotSize: uint32(c.cfg.Phases[phase]), Phase: uint32(phase)}
	b := make([]byte, ackLen)
	a.put(b)
	p.lastAck = b
	c.stats.EnlargementsServed++
	p.writeAck(b, p.lastAckSlot)
	c.stats.LastEnlargement.AckPost = time.Since(posting)
}

// provisionLarge is Figure 4 on the sender: once the old staging buffers are idle, they
// are unregistered and freed, larger ones allocated and registered, and the peer's new
// ring (from the acknowledgement) used from now on.
func (p *peer) provisionLarge() bool {
	a := p.ack
	start := time.Now()
	if busy := p.c.cfg.SendSlots - len(p.stageFree); busy == 0 {
		p.c.deregBuf(p.stage) // blocks 455-456
	} else {
		// Writes from the old staging buffers (the control message's, at least) are
		// not acknowledged yet: unregister them when they are, rather than wait here.
		p.retired, p.retiredBusy = p.stage, busy
	}
	p.stage = nil
	p.stageGen++
	if err := p.newStage(int(a.SlotSize)); err != nil { // blocks 457-458
		p.down(err)
		return false
	}
	// Block 459: the new ring's address and key.
	p.rAddr, p.rKey, p.rSlots, p.rSize, p.rPhase = a.Addr, a.RKey, int(a.Slots), int(a.SlotSize), int(a.Phase)
	p.rGen++
	p.credits, p.sendSeq = p.rSlots, 0
	p.ctlSent, p.useLarge, p.ackNotified = false, false, false
	p.c.stats.LastEnlargement.Provision = time.Since(start)
	p.firstSend = true
	return true
}

package msg

import (
	"fmt"
	"time"

	"github.com/softrnic/softrnic/verbs"
)

// Enlargement: a connection's direction grows its ring, one phase at a time, when a
// message does not fit its slots. The steps, in the order they happen:
//
//  1. The sender's send routine (transfer) finds that the first message waiting does not
//     fit the peer's current slots. It writes a control message (kindEnlarge: the phase
//     wanted, a fresh nonce, the acknowledgement slot to answer into) through the current
//     slots, after everything it wrote before, and from then on sends nothing more into
//     that ring; while it waits it reports that nothing went, and never blocks.
//  2. The receiver reaches the control message in ring order (serveEnlarge), so every
//     message written before it has been taken out of the ring already: it unregisters
//     the ring, registers one of the phase asked for, and writes the acknowledgement
//     (the new ring's address, key, slot count and size) into the sender's
//     acknowledgement area (ack.go).
//  3. The sender reads a complete acknowledgement for its nonce (pollAck), unregisters
//     its staging buffers, registers larger ones, and sends into the new ring
//     (provisionLarge), starting again at its slot 0 with a full set of credits.
//
// Each direction of a connection grows on its own; a connection never shrinks.

// transfer is the connection's send routine, over its send vector: it returns how many
// elements it handed to the transport, 0 when it is waiting (for the peer's
// acknowledgement, credits, or staging room), and never blocks. It hands over the longest
// prefix of the vector whose elements fit the peer's current slots; when the first
// element does not fit, it asks the peer for larger slots (step 1 above) and waits for
// the answer, reporting 0 each time it is called meanwhile.
func (p *peer) transfer() (sent int) {
	c := p.c
	if p.ctlSent { // an enlargement was asked for
		if !p.pollAck() { // no complete acknowledgement yet
			c.lab.ZeroByteReports++ // tell the caller nothing went
			return 0
		}
		if !p.provisionLarge() { // the sender's side of the enlargement (step 3)
			c.lab.ZeroByteReports++
			return 0
		}
	}
	// The elements of the vector, one by one, against the threshold of the slots in use;
	// the prefix that fits goes now.
	n := 0
	for i, m := range p.sendQ {
		if m.size() > c.cfg.threshold(p.rPhase) {
			if i == 0 { // the first element does not fit: the connection must grow
				p.useLarge = true
				p.target = c.cfg.phaseFor(m.size())
			}
			break // a later one: the prefix goes now, the rest after enlargement
		}
		n++
	}
	if n == 0 { // nothing fits: ask the receiver to provision larger slots
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
		c.lab.ZeroByteReports++ // and report 0 bytes to the caller
		return 0
	}
	if n < len(p.sendQ) && !p.useLarge {
		c.lab.PrefixSends++ // a later element is too large: it waits for the enlargement
		p.useLarge = true
		p.target = c.cfg.phaseFor(p.sendQ[n].size())
	}
	// The prefix (in the new slots, right after an enlargement), as credits and staging
	// allow.
	for n > 0 && p.credits > 0 && len(p.stageFree) > 0 && p.sqUsed < sqDepth {
		m := p.sendQ.pop()
		n--
		p.writeSlot(&m)
		sent++
	}
	return sent
}

// serveEnlarge is the receiver's side of an enlargement (step 2 above), when it reaches
// the control message in its ring; it is handled like any slot, so the rank's other
// connections do not wait for it. The ring is unregistered and given back to the reserve,
// and one of the phase asked for is registered and used from now on (it is counted from
// slot 0, and the credits owed for the old ring are dropped: the sender starts the new
// one with all of them); then the acknowledgement, with the new ring's address and remote
// key framed by the nonce's head and tail flags, goes to the sender.
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
	c.lab.LastEnlargement.Serve = posting.Sub(start)
	p.recvSeq, p.owed = 0, 0
	a := ack{Nonce: nonce, Addr: mr.Addr(), RKey: mr.RKey(), Slots: uint32(c.cfg.Slots), SlotSize: uint32(c.cfg.Phases[phase]), Phase: uint32(phase)}
	b := make([]byte, ackLen)
	a.put(b)
	p.lastAck = b
	c.stats.EnlargementsServed++
	p.writeAck(b, p.lastAckSlot)
	c.lab.LastEnlargement.AckPost = time.Since(posting)
}

// provisionLarge is the sender's side of an enlargement (step 3 above), once a complete
// acknowledgement is read: the old staging buffers are unregistered (when their writes
// have completed), larger ones registered, and the peer's new ring, from the
// acknowledgement, used from now on.
func (p *peer) provisionLarge() bool {
	a := p.ack
	start := time.Now()
	if busy := p.c.cfg.SendSlots - len(p.stageFree); busy == 0 {
		p.c.deregBuf(p.stage)
	} else {
		// Writes from the old staging buffers (the control message's, at least) are
		// not acknowledged yet: unregister them when they are, rather than wait here.
		p.retired, p.retiredBusy = p.stage, busy
	}
	p.stage = nil
	p.stageGen++
	if err := p.newStage(int(a.SlotSize)); err != nil {
		p.down(err)
		return false
	}
	// The new ring's address and key; a new generation, whose credits alone count.
	p.rAddr, p.rKey, p.rSlots, p.rSize, p.rPhase = a.Addr, a.RKey, int(a.Slots), int(a.SlotSize), int(a.Phase)
	p.rGen++
	p.credits, p.sendSeq = p.rSlots, 0
	p.ctlSent, p.useLarge, p.ackNotified = false, false, false
	p.c.lab.LastEnlargement.Provision = time.Since(start)
	p.firstSend = true
	return true
}

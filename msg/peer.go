package msg

import (
	"fmt"
	"time"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/internal/pages"
	"github.com/softrnic/softrnic/verbs"
)

// peerState is where a connection is in its life (connect.go).
type peerState int

const (
	psIdle      peerState = iota
	psDialing             // our Dial is in flight
	psAwaiting            // our Dial lost the tie-break: the peer's request is coming
	psAccepting           // we accept the peer's request
	psUp
	psDead
)

// Work request IDs: kind in the top byte.
const (
	wrStage  = 1 << 56 // a slot write from a staging buffer (bits 32-39: staging generation; low bits: index)
	wrCredit = 2 << 56
	wrAck    = 3 << 56
	wrRndv   = 4 << 56 // a rendezvous WRITE (low bits: the message ID)
	wrNotify = 5 << 56
	wrKind   = 0xFF << 56
)

// maxRendezvous is the longest message a peer may announce (an RDMA WRITE's limit).
const maxRendezvous = 1 << 31

// sqDepth is each connection's send queue.
const sqDepth = 128

// outMsg is an element of a connection's send vector: a message or a control message.
type outMsg struct {
	kind uint8
	req  *Request
	id   uint64 // kindFIN: the message read
}

// size is what the element needs of a slot's payload room.
func (m *outMsg) size() int {
	if m.kind == kindData {
		return len(m.req.buf)
	}
	return 0
}

// peer is this rank's connection to one other rank: the ring it receives into (written by
// the peer), the peer's ring it sends into, staging buffers, and the state of an
// enlargement in each direction. Guarded by the progress lock.
type peer struct {
	c      *Comm
	rank   int
	state  peerState
	conn   *cm.Conn
	qp     *verbs.QP
	dialQP *verbs.QP // the QP our Dial in flight uses (p.qp unless we accepted meanwhile)
	err    error
	queued bool
	sqUsed int

	// Receive direction: our ring, written by the peer.
	ring    *verbs.MR
	phase   int    // our ring's phase
	gen     int    // our ring's generation (one per enlargement)
	recvSeq uint64 // slots consumed
	owed    int    // credits to give back
	ackMR   *verbs.MR
	lastAck []byte // the acknowledgement last written, for a resend
	pAck    uint64 // the peer's acknowledgement area
	pAckKey uint32
	known   bool // the peer's hello was taken (its ring and acknowledgement area)

	ackDeferred bool // an acknowledgement waits for the peer's hello (our Dial's answer)

	// Send direction: the peer's ring.
	rAddr                 uint64
	rKey                  uint32
	rSlots, rSize, rPhase int
	rGen                  int
	credits               int
	sendSeq               uint64
	stage                 *verbs.MR
	stageFree             []int
	stageGen              int       // staging buffers provisioned so far (in WRIDs)
	retired               *verbs.MR // the previous staging buffers, until their writes complete
	retiredBusy           int
	sendQ                 sendVector
	inflight              map[uint64]*Request // rendezvous sends, until their WRITE completes
	recvRndv              map[uint64]*Request // rendezvous receives, by the sender's message ID, until FIN
	writeQ                []*Request          // rendezvous WRITEs waiting for room

	// The enlargement, sender side (enlarge.go).
	useLarge    bool // a message waiting needs larger slots than the peer's current ones
	ctlSent     bool // the control message asking for them went out
	target      int  // the phase asked for
	ackNonce    uint32
	ackSince    time.Time
	ctlAt       time.Time // when the control message was written (before its post)
	firstSend   bool      // the next post is the first through the larger slots (timed)
	ackAsks     int       // times the acknowledgement was asked for again in this enlargement
	ackNotified bool      // an acknowledgement was written since the area was last read
	ack         ack       // the complete acknowledgement
	ackBusy     bool      // receiver: our acknowledgement WRITE is in flight
	ackPending  bool      // receiver: another one is to be written when it completes
	ackSlot     int       // the slot of our area the next acknowledgement is written to

	lastAckSlot int // receiver: the slot of the sender's area the acknowledgement goes to

	wr  [1]verbs.SendWR // the work request being posted (no allocation per post)
	sge [1]verbs.SGE
}

// sendVector is a connection's send vector: the messages and control messages waiting
// to go, in order, in storage that is reused.
type sendVector []outMsg

func (v *sendVector) push(m outMsg) { *v = append(*v, m) }

// pushFront puts a control message before the messages waiting.
func (v *sendVector) pushFront(m outMsg) {
	*v = append(*v, outMsg{})
	copy((*v)[1:], *v)
	(*v)[0] = m
}

// pop takes the first element.
func (v *sendVector) pop() outMsg { return v.remove(0) }

// remove takes element i.
func (v *sendVector) remove(i int) outMsg {
	m := (*v)[i]
	n := i + copy((*v)[i:], (*v)[i+1:])
	(*v)[n] = outMsg{}
	*v = (*v)[:n]
	return m
}

func (v *sendVector) clear() {
	clear(*v)
	*v = (*v)[:0]
}

func newPeer(c *Comm, r int) (*peer, error) {
	p := &peer{c: c, rank: r, inflight: map[uint64]*Request{}, recvRndv: map[uint64]*Request{}}
	if r == c.rank {
		return p, nil
	}
	var err error
	if p.qp, err = c.newQP(); err != nil {
		return nil, fmt.Errorf("msg: connection to rank %d: %w", r, err)
	}
	if p.ring, err = c.regBuf(c.cfg.Slots*c.cfg.Phases[0], verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
		return nil, err
	}
	ack := make([]byte, ackAreaLen)
	pages.Prepare(ack) // its first acknowledgement must not wait for its page
	if p.ackMR, err = c.pd.RegMR(ack, verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
		return nil, err
	}
	if err := p.newStage(c.cfg.Phases[0]); err != nil {
		return nil, err
	}
	return p, nil
}

// newQP creates a connection's RC QP on the rank's SRQ, in INIT.
func (c *Comm) newQP() (*verbs.QP, error) {
	qp, err := c.pd.CreateQP(&verbs.QPInitAttr{SendCQ: c.cq, RecvCQ: c.cq, SRQ: c.srq,
		Cap: verbs.QPCap{MaxSendWR: sqDepth, MaxSendSGE: 1}})
	if err != nil {
		return nil, err
	}
	if err := cm.InitQP(qp, verbs.AccessRemoteWrite|verbs.AccessRemoteRead); err != nil {
		qp.DestroyQP()
		return nil, err
	}
	return qp, nil
}

// newStage provisions the sender's staging buffers for slots of size bytes.
func (p *peer) newStage(size int) error {
	mr, err := p.c.regBuf(p.c.cfg.SendSlots*size, verbs.AccessLocalWrite)
	if err != nil {
		return err
	}
	p.stage = mr
	p.stageFree = p.stageFree[:0]
	for i := p.c.cfg.SendSlots - 1; i >= 0; i-- {
		p.stageFree = append(p.stageFree, i)
	}
	return nil
}

// needsProgress reports whether the progress engine should call progress again
// without waiting for a completion.
func (p *peer) needsProgress() bool {
	if p.state != psUp {
		return false
	}
	if p.ctlSent || len(p.writeQ) > 0 && p.sqUsed < sqDepth || p.owed >= p.creditBatch() && p.sqUsed < sqDepth {
		return true
	}
	return len(p.sendQ) > 0 && p.credits > 0 && len(p.stageFree) > 0 && p.sqUsed < sqDepth
}

func (p *peer) creditBatch() int { return max(1, p.c.cfg.Slots/2) }

// progress moves what the connection can: rendezvous WRITEs, the send routine, credits.
func (p *peer) progress() bool {
	if p.state != psUp {
		return false
	}
	worked := false
	for len(p.writeQ) > 0 && p.sqUsed < sqDepth {
		r := p.writeQ[0]
		p.writeQ = p.writeQ[1:]
		p.postWrite(r)
		worked = true
	}
	if len(p.sendQ) > 0 || p.ctlSent {
		if p.transfer() > 0 {
			worked = true
		}
	}
	if p.owed >= p.creditBatch() && p.sqUsed < sqDepth {
		p.postImm(wrCredit, imm(immCredit, p.gen, p.owed, 0))
		p.owed = 0
		p.c.stats.CreditMessages++
		worked = true
	}
	return worked
}

// completion handles one completion of the rank's CQ (progress lock held).
func (c *Comm) completion(wc *verbs.WorkCompletion) {
	p := c.byQPN[wc.QPNum]
	if wc.Opcode == verbs.WCRecvRDMAWithImm || (wc.Status != verbs.WCSuccess && wc.WRID == 0) {
		// An SRQ receive: put it back.
		c.srqOwed++ // pollCQ puts it back
	} else if p != nil {
		p.sqUsed--
	}
	if p == nil {
		return
	}
	if wc.Status != verbs.WCSuccess {
		p.down(fmt.Errorf("%v (%v) wrid %#x op %v", wc.Status, wc.VendorErr, wc.WRID, wc.Opcode))
		return
	}
	switch wc.Opcode {
	case verbs.WCRecvRDMAWithImm:
		p.onImm(wc.ImmData)
	case verbs.WCRDMAWrite:
		switch wc.WRID & wrKind {
		case wrStage:
			if gen := int(wc.WRID >> 32 & 0xFF); gen != p.stageGen&0xFF {
				// A write from staging buffers replaced since: the last one frees them.
				if p.retiredBusy--; p.retiredBusy == 0 && p.retired != nil {
					c.deregBuf(p.retired)
					p.retired = nil
				}
				break
			}
			p.stageFree = append(p.stageFree, int(wc.WRID&0xFFFFFFFF))
		case wrRndv:
			p.written(wc.WRID &^ wrKind)
		case wrAck:
			p.ackBusy = false
			if p.ackPending {
				p.ackPending = false
				p.writeAck(p.lastAck, p.lastAckSlot)
			}
		}
		if len(p.sendQ) > 0 {
			c.activate(p)
		}
	}
}

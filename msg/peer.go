package msg

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/internal/pages"
	"github.com/softrnic/softrnic/verbs"
)

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
// the peer), the peer's ring it sends into, staging buffers, and the enlargement state of
// seed 004 for each direction. Guarded by the progress lock.
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

	// Seed 004's variables, sender side.
	useLarge    bool // block 332/574: large buffers are to be used
	ctlSent     bool // block 334/344: the control message went out
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

// sendVector is a connection's send vector (seed 004): its elements in order, in storage
// that is reused.
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

func (p *peer) hello() []byte {
	c := p.c
	h := hello{Job: c.job, Rank: uint32(c.rank), RingAddr: p.ring.Addr(), RingKey: p.ring.RKey(), Slots: uint32(c.cfg.Slots),
		SlotSize: uint32(c.cfg.Phases[0]), AckAddr: p.ackMR.Addr(), AckKey: p.ackMR.RKey()}
	return h.put()
}

// connectOptions are the connections' attributes. The local ACK timeout is 268 ms (16)
// rather than the usual 67 ms: with seven retries a connection survives its peer's
// process not running for two seconds, as happens to jobs of many ranks on a machine
// busy with other work (a lost packet that no later one reveals costs that timeout).
func (c *Comm) connectOptions() verbs.ConnectOptions {
	return verbs.ConnectOptions{MTU: verbs.MTU4096, Ordering: c.cfg.Ordering, Timeout: 16}
}

// connect dials the peer unless a connection is made or being made.
func (p *peer) connect() {
	if p.state != psIdle || p.rank == p.c.rank {
		return
	}
	c := p.c
	p.state = psDialing
	to := c.book[p.rank]
	data := p.hello()
	qp := p.qp
	p.dialQP = qp
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.ConnectTimeout)
		defer cancel()
		conn, err := cm.Dial(ctx, c.dev, netip.AddrPortFrom(to.Addr(), servicePort), qp,
			&cm.DialParams{PrivateData: data, DevicePort: to.Port(), Options: c.connectOptions()})
		if !c.submit(func() { c.onDialed(p, conn, err) }) && conn != nil {
			conn.Disconnect()
		}
	}()
}

// Reject reasons in private data.
var (
	rejTie = []byte("tie") // both dialed; the lower rank's Dial wins
	rejDup = []byte("dup") // already connected
	rejJob = []byte("job") // not of this job
)

func (c *Comm) onDialed(p *peer, conn *cm.Conn, err error) {
	if dq := p.dialQP; dq != nil && dq != p.qp {
		// We accepted the peer's request on a fresh QP meanwhile: this one is done.
		delete(c.byQPN, dq.QPNum())
		p.dialQP = nil
		if conn != nil {
			go conn.Disconnect()
		}
		go dq.DestroyQP()
		return
	}
	p.dialQP = nil
	if err == nil {
		if p.state != psDialing {
			go conn.Disconnect()
			return
		}
		h, ok := getHello(conn.PrivateData())
		if !ok || h.Job != c.job || int(h.Rank) != p.rank {
			go conn.Disconnect()
			p.down(fmt.Errorf("rank %d answered as another job's rank %d", p.rank, h.Rank))
			return
		}
		p.up(conn, h)
		return
	}
	if p.state != psDialing {
		return // we accepted the peer's request instead
	}
	var rej *cm.RejectError
	if errors.As(err, &rej) && string(trimZero(rej.PrivateData)) == string(rejTie) {
		p.state = psAwaiting
		return
	}
	p.down(err)
}

// onRequest answers a connection request from another rank.
func (c *Comm) onRequest(req *cm.Request) {
	h, ok := getHello(req.PrivateData)
	if !ok || h.Job != c.job || int(h.Rank) >= c.size || int(h.Rank) == c.rank {
		req.Reject(rejJob)
		return
	}
	p, err := c.peer(int(h.Rank))
	if err != nil {
		req.Reject(nil)
		return
	}
	switch p.state {
	case psUp, psAccepting, psDead:
		req.Reject(rejDup)
		return
	case psDialing:
		if c.rank < p.rank {
			req.Reject(rejTie)
			return
		}
		// Both dialed; the peer's Dial wins. Ours may not have sent its request yet
		// (it runs in its own goroutine): accept on a fresh QP, so that our request,
		// whenever it leaves, names a QP the peer has not connected to (else the
		// peer's CM would take it for a stale connection's).
		qp, err := c.newQP()
		if err != nil {
			req.Reject(nil)
			return
		}
		p.qp = qp
		c.byQPN[qp.QPNum()] = p
	}
	p.state = psAccepting
	if h.Slots >= 2 && h.Slots <= maxCredits && h.SlotSize == uint32(c.cfg.Phases[0]) {
		// Known now: the dialer may write before Accept returns here (its Dial returns
		// first), and an enlargement it asks for is acknowledged into this area.
		p.learn(h)
	}
	data := p.hello()
	opts := c.connectOptions()
	go func() {
		conn, err := req.Accept(p.qp, &cm.AcceptParams{PrivateData: data, Options: opts})
		ok := c.submit(func() {
			if err != nil {
				p.down(err)
				return
			}
			p.up(conn, h)
		})
		if !ok && conn != nil {
			conn.Disconnect()
		}
	}()
}

// up makes the connection usable: the peer's first ring and acknowledgement area.
func (p *peer) up(conn *cm.Conn, h hello) {
	c := p.c
	if h.Slots < 2 || h.Slots > maxCredits || h.SlotSize < hdrLen+8 || h.SlotSize != uint32(c.cfg.Phases[0]) {
		go conn.Disconnect()
		p.down(fmt.Errorf("rank %d's ring (%d slots of %d bytes) does not fit this job's configuration", p.rank, h.Slots, h.SlotSize))
		return
	}
	p.conn, p.state = conn, psUp
	p.learn(h)
	c.stats.Connections++
	if p.ackDeferred {
		p.ackDeferred = false
		p.writeAck(p.lastAck, p.lastAckSlot)
	}
	go func() {
		<-conn.Done()
		c.submit(func() {
			// What the peer sent before it disconnected is already in the CQ (it was
			// acknowledged before the DisconnectRequest left): take it first.
			c.pollCQ()
			p.down(conn.Err())
		})
	}()
	c.activate(p)
}

// learn takes the peer's first ring and acknowledgement area from its hello.
func (p *peer) learn(h hello) {
	if p.known {
		return
	}
	p.known = true
	p.rAddr, p.rKey, p.rSlots, p.rSize, p.rPhase = h.RingAddr, h.RingKey, int(h.Slots), int(h.SlotSize), 0
	p.credits = p.rSlots
	p.pAck, p.pAckKey = h.AckAddr, h.AckKey
}

// down ends the connection: every request involving the peer fails.
func (p *peer) down(err error) {
	if p.state == psDead {
		return
	}
	p.state = psDead
	p.err = errPeer(p.rank, err)
	p.fail(p.err)
	if p.qp != nil {
		p.qp.ModifyQP(&verbs.QPAttr{QPState: verbs.StateErr}, verbs.QPAttrState)
	}
}

// fail ends every request that involves the peer with err.
func (p *peer) fail(err error) {
	c := p.c
	for _, m := range p.sendQ {
		if m.req != nil {
			m.req.complete(err)
		}
	}
	p.sendQ.clear()
	for id, r := range p.inflight {
		r.complete(err)
		delete(p.inflight, id)
		c.transfers--
	}
	for id, r := range p.recvRndv {
		r.complete(err)
		delete(p.recvRndv, id)
		c.transfers--
	}
	p.writeQ = nil // their requests are in inflight
	keep := c.posted[:0]
	for _, r := range c.posted {
		if r.peer == p.rank {
			r.complete(err)
		} else {
			keep = append(keep, r)
		}
	}
	c.posted = keep
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

// pollAck looks at the acknowledgement area (block 348): complete, partial (the head
// flag without the tail, or a bad CRC: poll again), or nothing. Without a complete one
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
			c.stats.LastEnlargement.AckWait = time.Since(p.ctlAt)
			return true
		}
		st = ackPartial // not what was asked: as good as corrupt
	}
	if st == ackPartial {
		c.stats.AckPartialSeen++
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
		c.stats.LastEnlargement.ToFirstSend = time.Since(p.ctlAt)
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

func trimZero(b []byte) []byte {
	for len(b) > 0 && b[len(b)-1] == 0 {
		b = b[:len(b)-1]
	}
	return b
}

package cm

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/softrnic/softrnic/internal/mad"
	"github.com/softrnic/softrnic/verbs"
)

// state is where a connection is in the CM state machine (IBTA 12.9, simplified to the
// states a connection without alternate paths has; UD services resolve in sidr.go).
type state uint8

const (
	stReqSent     state = iota + 1 // active: REQ sent, waiting for REP (or MRA, REJ)
	stReqRcvd                      // passive: REQ in a listener's backlog or with the application
	stMRASent                      // passive: the application is slow, the requester was told to wait
	stRepSent                      // passive: REP sent, waiting for RTU
	stEstablished                  // both QPs in RTS
	stDreqSent                     // Disconnect: DREQ sent, waiting for DREP
	stTimewait                     // ended; late duplicates are still answered
	stGone                         // forgotten
)

// conn is one connection's CM state, guarded by its manager's mu.
type conn struct {
	m        *manager
	id       uint32 // local communication ID
	remoteID uint32 // the peer's communication ID
	peer     netip.AddrPort
	peerQPN  uint32
	active   bool
	qp       *verbs.QP
	state    state
	tid      uint64
	msg      [mad.Size]byte // the message a retry or a duplicate resends (REQ, REP, REJ, DREQ)
	msgAttr  mad.AttrID

	retries, maxRetries int
	timeout             time.Duration // how long to wait for the peer's answer
	timer               *time.Timer
	gen                 uint64 // timer generation: a timer of an older one does nothing
	holdsSlot           bool   // an active connection holding one of MaxREQInFlight

	req       mad.REQ // passive: the request
	params    verbs.ConnectOptions
	peerData  []byte // the peer's private data (REP's for the active side, REQ's for the passive)
	ordering  verbs.Ordering
	keepAlive time.Duration
	// softPeer: the peer sent softrnic's extension. It answers keep-alive probes and sends
	// its MADs from its device port, which is then the only one taken from it.
	softPeer bool

	ready     chan struct{} // closed when Dial's or Accept's wait ends
	readyErr  error
	readyDone bool
	done      chan struct{} // closed when the connection ends
	err       error
	ended     bool
	discDone  chan struct{} // closed when a local Disconnect finished
	discErr   error
}

func (m *manager) newConn(active bool, peer netip.AddrPort) *conn {
	c := &conn{m: m, id: m.newID(), active: active, peer: peer, ready: make(chan struct{}), done: make(chan struct{})}
	c.tid = uint64(c.id) << 32
	m.ids[c.id] = c
	return c
}

// from reports whether a MAD from src may be the peer's: from its device port if it is a
// softrnic device, from any port of its address otherwise (a standard peer's MADs leave
// from a port of its own choosing; see RoCEv2Port).
func (c *conn) from(src netip.AddrPort) bool {
	if c.softPeer {
		return c.peer == src
	}
	return c.peer.Addr() == src.Addr()
}

// keep encodes msg as the connection's current message and sends it (mu held).
func (c *conn) keep(msg mad.Message) {
	mad.Put(c.msg[:], c.tid, msg)
	c.msgAttr = msg.Attr()
	c.m.send(c.peer, c.msg[:])
}

// resend sends the current message again (mu held).
func (c *conn) resend() { c.m.send(c.peer, c.msg[:]) }

// arm starts the connection's timer (mu held).
func (c *conn) arm(d time.Duration) {
	c.gen++
	gen := c.gen
	if c.timer != nil {
		c.timer.Stop()
	}
	c.timer = time.AfterFunc(d, func() { c.m.onTimer(c, gen) })
}

func (c *conn) stopTimer() {
	c.gen++
	if c.timer != nil {
		c.timer.Stop()
	}
}

// finish ends Dial's or Accept's wait with err (nil: established; mu held).
func (c *conn) finish(err error) {
	if c.readyDone {
		return
	}
	c.readyDone, c.readyErr = true, err
	c.releaseSlot()
	close(c.ready)
}

// end ends the connection with err, telling Done's readers (mu held).
func (c *conn) end(err error) {
	if c.ended {
		return
	}
	c.ended, c.err = true, err
	close(c.done)
}

func (c *conn) releaseSlot() {
	if c.holdsSlot {
		c.holdsSlot = false
		<-c.m.reqSlots
	}
}

// toErr moves the QP to ERR: its outstanding work requests are flushed (mu held).
func (c *conn) toErr() {
	if c.qp != nil {
		_ = c.qp.ModifyQP(&verbs.QPAttr{QPState: verbs.StateErr}, verbs.QPAttrState)
	}
}

// establish records an established connection (mu held).
func (c *conn) establish() {
	m := c.m
	c.state = stEstablished
	c.retries = 0
	c.stopTimer()
	if old := m.byQP[remoteKey{c.peer, c.peerQPN}]; old == nil || old == c {
		m.byQP[remoteKey{c.peer, c.peerQPN}] = c
	}
	m.stats.Established++
	m.attachPeer(c)
	c.finish(nil)
}

// timewait ends the connection and holds its IDs a while for late duplicates (mu held).
func (c *conn) timewait() {
	m := c.m
	if k := (remoteKey{c.peer, c.peerQPN}); m.byQP[k] == c {
		delete(m.byQP, k)
	}
	m.detachPeer(c)
	c.state = stTimewait
	c.arm(min(max(c.timeout, 50*time.Millisecond), 5*time.Second))
	if c.discDone != nil {
		close(c.discDone)
		c.discDone = nil
	}
}

// forget drops every reference to the connection (mu held).
func (c *conn) forget() {
	m := c.m
	c.stopTimer()
	c.releaseSlot()
	if m.ids[c.id] == c {
		delete(m.ids, c.id)
	}
	if k := (remoteKey{c.peer, c.remoteID}); !c.active && m.byRemote[k] == c {
		delete(m.byRemote, k)
	}
	if k := (remoteKey{c.peer, c.peerQPN}); m.byQP[k] == c {
		delete(m.byQP, k)
	}
	m.detachPeer(c)
	c.state = stGone
	if c.discDone != nil {
		close(c.discDone)
		c.discDone = nil
	}
}

// onTimer is a connection's timer: resend, or give up (its own goroutine).
func (m *manager) onTimer(c *conn, gen uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || c.gen != gen {
		return
	}
	switch c.state {
	case stReqSent, stRepSent, stDreqSent:
		if c.retries < c.maxRetries {
			c.retries++
			switch c.state {
			case stReqSent:
				m.stats.REQRetries++
			case stRepSent:
				m.stats.REPRetries++
			case stDreqSent:
				m.stats.DREQRetries++
			}
			c.resend()
			c.arm(c.timeout)
			return
		}
		err := fmt.Errorf("%w (%d retries, %v each)", ErrTimeout, c.retries, c.timeout)
		switch c.state {
		case stReqSent, stRepSent:
			// Tell the peer we give up, so that it does not keep a half-open connection.
			rej := mad.REJ{LocalCommID: c.id, RemoteCommID: c.remoteID, MessageRejected: mad.MsgREQ, Reason: mad.RejTimeout}
			if c.state == stRepSent {
				rej.MessageRejected = mad.MsgREP
				c.toErr() // the passive QP was connected; the active one stays in INIT
			}
			m.stats.REJSent++
			c.keep(&rej)
			c.finish(err)
			c.end(err)
			c.timewait()
		case stDreqSent:
			c.discErr = err
			c.timewait()
		}
	case stTimewait:
		c.forget()
	}
}

// Conn is an established connection: a QP in RTS connected to the peer's.
type Conn struct {
	c        *conn
	qp       *verbs.QP
	peer     netip.AddrPort
	peerQPN  uint32
	data     []byte
	ordering verbs.Ordering
}

func newConn(c *conn) *Conn {
	return &Conn{c: c, qp: c.qp, peer: c.peer, peerQPN: c.peerQPN, data: c.peerData, ordering: c.ordering}
}

// QP is the connection's queue pair.
func (cn *Conn) QP() *verbs.QP { return cn.qp }

// RemoteAddr is the peer device's address and UDP port.
func (cn *Conn) RemoteAddr() netip.AddrPort { return cn.peer }

// RemoteQPN is the peer's QP number.
func (cn *Conn) RemoteQPN() uint32 { return cn.peerQPN }

// PrivateData is the peer's private data: the accept's (196 bytes) on the dialing side,
// the connect's (56 bytes) on the accepting side, zero-padded as rdma_cm gives it.
func (cn *Conn) PrivateData() []byte { return cn.data }

// Ordering is the ordering mode both sides agreed on.
func (cn *Conn) Ordering() verbs.Ordering { return cn.ordering }

// Done is closed when the connection ends: disconnected by either side, the peer
// unreachable, or the device closed. Err then says why.
func (cn *Conn) Done() <-chan struct{} { return cn.c.done }

// Err is nil while the connection is up, then why it ended: ErrDisconnected,
// ErrPeerUnreachable, ErrTimeout or ErrClosed (test with errors.Is).
func (cn *Conn) Err() error {
	m := cn.c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	return cn.c.err
}

// Disconnect ends the connection as rdma_disconnect does: the QP moves to ERR (its
// outstanding work requests complete with flush errors), a DisconnectRequest goes to the
// peer, which moves its QP to ERR and answers. Disconnect returns when the answer came,
// or with ErrTimeout when none came after the retries, or ErrPeerUnreachable when the
// keep-alive gave up on the peer first (the connection is ended anyway); ErrClosed after
// the device closed.
// Calling it again, or after the peer disconnected, returns nil at once.
func (cn *Conn) Disconnect() error {
	c := cn.c
	m := c.m
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return &callError{op: "Disconnect", err: errDeviceClosed}
	}
	if c.state != stEstablished {
		wait := c.discDone
		m.mu.Unlock()
		if wait != nil {
			<-wait
		}
		return nil
	}
	c.toErr()
	c.state = stDreqSent
	c.retries = 0
	c.sendDREQ()
	c.arm(c.timeout)
	m.stats.Disconnected++
	c.end(ErrDisconnected)
	wait := make(chan struct{})
	c.discDone = wait
	m.mu.Unlock()
	<-wait
	m.mu.Lock()
	err := c.discErr
	m.mu.Unlock()
	if err == ErrDisconnected {
		err = nil
	}
	return err
}

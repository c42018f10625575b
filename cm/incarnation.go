package cm

import (
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/softrnic/softrnic/internal/mad"
)

// A device's incarnation is a random number drawn when it opens (gsiport.Port.Incarnation).
// A process killed without a word leaves its connections here half-open; a new process
// that opens a device on the same address and port would answer their keep-alive probes
// as if it were the old one. The incarnation tells the two apart: a softrnic peer carries
// it as the CA GUID of its REQ and REP (random per device already, so a standard peer sees
// the field as before) and in its keep-alive probes and their answers (mad.PutIncarnation).
// When a peer device's address shows another incarnation than its connections here were
// made with, the device there restarted: every connection to the old one ends at once with
// ErrPeerRestarted, whatever message showed it (a probe's answer, a probe, a new REQ or
// REP), and a connection the new one asks for is made as usual.

// remoteInc is the incarnation of a softrnic peer device as this device's connections to
// it know it, and how many connections (not yet forgotten) were made with it.
type remoteInc struct {
	inc   uint64
	conns int
}

// setPeerInc records that the connection c was made with the peer device's incarnation
// inc (a softrnic peer's REQ or REP; mu held).
func (c *conn) setPeerInc(inc uint64) {
	if inc == 0 || c.peerInc != 0 {
		return
	}
	m := c.m
	c.peerInc = inc
	r := m.incs[c.peer]
	if r == nil {
		r = &remoteInc{}
		m.incs[c.peer] = r
	}
	r.inc = inc
	r.conns++
}

// dropPeerInc forgets the connection's part in its peer's incarnation record (mu held).
func (c *conn) dropPeerInc() {
	if c.peerInc == 0 {
		return
	}
	m := c.m
	if r := m.incs[c.peer]; r != nil {
		if r.conns--; r.conns <= 0 {
			delete(m.incs, c.peer)
		}
	}
	c.peerInc = 0
}

// seeIncarnation takes note that the softrnic device at src is incarnation inc (0:
// unknown). If this device has connections with another incarnation at src, that one is
// gone: they end now, with ErrPeerRestarted (mu held).
func (m *manager) seeIncarnation(src netip.AddrPort, inc uint64) {
	r := m.incs[src]
	if inc == 0 || r == nil || r.inc == inc {
		return
	}
	old := r.inc
	r.inc = inc
	m.stats.PeerRestarts++
	err := fmt.Errorf("%w: the device at %v is a new one (incarnation %#x, was %#x); its connections here ended",
		ErrPeerRestarted, src, inc, old)
	for _, c := range m.ids {
		if c.peer == src && c.peerInc != 0 && c.peerInc != inc {
			c.peerRestarted(err)
		}
	}
}

// peerRestarted ends a connection whose peer device is gone, replaced by a new one at its
// address: its QP goes to ERR, whoever waits is told err. No DisconnectRequest is sent:
// the new device knows nothing of the connection (mu held).
func (c *conn) peerRestarted(err error) {
	switch c.state {
	case stEstablished, stDreqSent, stRepSent:
		c.logEvent(slog.LevelWarn, evPeerRestarted, "a new device at the peer's address")
		if c.state == stDreqSent {
			c.discErr = err // Disconnect waits for a DREP that will not come
		}
		c.toErr()
		c.finish(err)
		c.end(err)
		c.timewait()
	case stReqRcvd, stMRASent:
		c.finish(err) // Accept skips it
		c.end(err)
		c.timewait()
	}
}

// classPortInfoIncarnation returns the incarnation a ClassPortInfo MAD from a softrnic
// peer carries (0 if none).
func classPortInfoIncarnation(b []byte) uint64 {
	inc, _ := mad.Incarnation(b)
	return inc
}

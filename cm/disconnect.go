package cm

import (
	"log/slog"
	"net/netip"

	"github.com/softrnic/softrnic/internal/mad"
)

// sendDREQ sends the connection's DisconnectRequest, kept for retries (mu held).
func (c *conn) sendDREQ() {
	c.m.stats.DREQSent++
	c.keep(&mad.DREQ{LocalCommID: c.id, RemoteCommID: c.remoteID, RemoteQPN: c.peerQPN})
}

// onDREQ: the peer disconnects. Its QP is going to ERR; ours does too, and the answer is
// a DREP. A DREQ that names no connection here is answered all the same (the peer may
// have missed our DREP after we forgot the connection), so that it stops resending; one
// that names a connection of ours with another QP number is dropped (mu held).
func (m *manager) onDREQ(src netip.AddrPort, tid uint64, d *mad.DREQ) bool {
	c := m.ids[d.RemoteCommID]
	if c == nil || !c.from(src) {
		// Whose DREQ this is cannot be told: a softrnic device listens on the port it
		// sent from, a standard peer on RoCEv2Port; answer both.
		m.stats.DREPSent++
		m.sendOnce(src, tid, &mad.DREP{LocalCommID: d.RemoteCommID, RemoteCommID: d.LocalCommID})
		if std := peerOf(src, false); std != src {
			m.sendOnce(std, tid, &mad.DREP{LocalCommID: d.RemoteCommID, RemoteCommID: d.LocalCommID})
		}
		return true
	}
	if c.remoteID != d.LocalCommID || c.qp == nil || d.RemoteQPN != c.qp.QPNum() {
		return false
	}
	switch c.state {
	case stEstablished, stDreqSent:
		if c.state == stEstablished {
			c.logEvent(slog.LevelInfo, evClosed, "disconnected by the peer")
		}
		c.toErr()
		c.end(ErrDisconnected)
		c.timewait()
	case stRepSent:
		// The requester went from RTU to DREQ and our RTU was lost: the connection
		// existed; end it. Accept's wait ends with ErrDisconnected.
		c.logEvent(slog.LevelInfo, evClosed, "disconnected by the peer before its ReadyToUse came")
		c.toErr()
		c.finish(ErrDisconnected)
		c.end(ErrDisconnected)
		c.timewait()
	case stTimewait:
	default:
		return false
	}
	m.stats.DREPSent++
	m.sendOnce(c.peer, tid, &mad.DREP{LocalCommID: c.id, RemoteCommID: c.remoteID})
	return true
}

// onDREP: the peer answered our DisconnectRequest (mu held).
func (m *manager) onDREP(src netip.AddrPort, d *mad.DREP) bool {
	c := m.lookup(src, d.RemoteCommID)
	if c == nil || c.remoteID != d.LocalCommID {
		return false
	}
	if c.state == stDreqSent {
		c.timewait()
	}
	return true
}

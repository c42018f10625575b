package cm

import (
	"fmt"
	"net/netip"

	"github.com/softrnic/softrnic/internal/mad"
)

// A peer device that is not there.
//
// On Linux the device hears when the host of a MAD's destination answers it with ICMP port
// unreachable: nothing is bound to that UDP port, so no device runs at that address (TCP's
// "connection refused"). The connection manager then gives up at once on what it was
// waiting for from that device, rather than after its retries or keep-alive misses: a
// Dial whose ConnectRequest got the report fails with ErrPeerUnreachable (so does a
// ResolveUD whose resolution request got it), a Disconnect
// whose DisconnectRequest got it returns ErrPeerUnreachable, and when a keep-alive probe
// gets it, every connection to that device ends with ErrPeerUnreachable. Elsewhere the
// system does not report closed ports to an unconnected UDP socket, and the timeouts
// decide (ErrTimeout after the retries; ErrPeerUnreachable after KeepAliveMisses probes).
//
// A report is acted on only if it quotes the MAD that is waiting: sent to that address and
// port, with its transaction ID (a connection's random communication ID, or the keep-alive's
// random sequence) and kind. A forger off the path would have to guess those; one on the
// path could as well drop the MADs, which ends the same way after the timeouts.

// PortUnreachable handles a report that the host of dst answered the MAD m quotes with
// ICMP port unreachable (gsiport.UnreachableHandler; QP1's agent goroutine).
func (m *manager) PortUnreachable(dst netip.AddrPort, quote []byte) {
	if len(quote) < mad.HeaderLen {
		return // too little quoted to tell which MAD it was
	}
	var b [mad.Size]byte // the quoted header, in a MAD's room
	copy(b[:], quote)
	h, err := mad.DecodeHeader(b[:])
	if err != nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	if h.AttrID == mad.AttrClassPortInfo && h.Method == mad.MethodGet {
		if p := m.peers[dst]; p != nil && p.sentProbe(h.TID) {
			m.peerGone(p)
		}
		return
	}
	if h.AttrID == mad.AttrSIDRREQ && h.Method == mad.MethodSend {
		m.resolutionUnreachable(dst, h.TID)
		return
	}
	c := m.sentTo(dst, h.TID)
	if c == nil || h.Method != mad.MethodSend {
		return
	}
	switch {
	case c.active && c.state == stReqSent && h.AttrID == mad.AttrREQ:
		remote := dst
		if port, ok := mad.ServicePort(c.req.ServiceID); ok {
			remote = netip.AddrPortFrom(dst.Addr(), port)
		}
		c.finish(fmt.Errorf("%w: %v: no device at %v (its host reports the UDP port closed)",
			ErrPeerUnreachable, remote, dst))
		c.forget()
	case c.state == stDreqSent && h.AttrID == mad.AttrDREQ:
		c.discErr = ErrPeerUnreachable // no DREP will come
		c.timewait()
	}
}

// resolutionUnreachable ends the ResolveUD whose request to dst carries transaction ID
// tid, if it still waits (mu held).
func (m *manager) resolutionUnreachable(dst netip.AddrPort, tid uint64) {
	if m.sidr == nil {
		return
	}
	for _, o := range m.sidr.out {
		if o.tid == tid && o.peer == dst {
			remote := dst
			if port, ok := mad.UDPServicePort(o.serviceID); ok {
				remote = netip.AddrPortFrom(dst.Addr(), port)
			}
			o.finish(nil, fmt.Errorf("%w: %v: no device at %v (its host reports the UDP port closed)",
				ErrPeerUnreachable, remote, dst))
			return
		}
	}
}

// sentTo returns the connection to dst whose messages carry transaction ID tid, or nil
// (mu held). A dialling side's ID is its communication ID's; an accepting side takes the
// requester's, and is found among the connections the keep-alive watches.
func (m *manager) sentTo(dst netip.AddrPort, tid uint64) *conn {
	if c := m.ids[uint32(tid>>32)]; c != nil && c.peer == dst && c.tid == tid {
		return c
	}
	if p := m.peers[dst]; p != nil {
		for c := range p.conns {
			if c.tid == tid {
				return c
			}
		}
	}
	return nil
}

// sentProbe reports whether tid is one of the keep-alive probes sent to the peer that
// are still unanswered (mu held).
func (p *peer) sentProbe(tid uint64) bool {
	return p.tid-tid < uint64(max(p.missed, 1))
}

// peerGone ends every connection to the peer device with ErrPeerUnreachable and stops
// probing it (mu held).
func (m *manager) peerGone(p *peer) {
	m.stats.PeersLost++
	delete(m.peers, p.addr)
	p.timer.Stop()
	for c := range p.conns {
		if c.state == stDreqSent {
			c.discErr = ErrPeerUnreachable // Disconnect waits for a DREP that will not come
		}
		c.toErr()
		c.end(ErrPeerUnreachable)
		c.timewait()
	}
}

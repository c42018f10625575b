package cm

import (
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/softrnic/softrnic/internal/mad"
)

// peer is a device this one has established connections with: one keep-alive probe per
// interval for all of them.
type peer struct {
	addr     netip.AddrPort
	conns    map[*conn]struct{}
	interval time.Duration
	missed   int
	timer    *time.Timer
	tid      uint64
}

// attachPeer adds an established connection to its peer device's keep-alive (mu held).
func (m *manager) attachPeer(c *conn) {
	if c.keepAlive < 0 || !c.softPeer {
		return // a standard CM need not answer ClassPortInfo: no probes to it
	}
	p := m.peers[c.peer]
	if p == nil {
		p = &peer{addr: c.peer, conns: map[*conn]struct{}{}, interval: c.keepAlive, tid: randUint64()}
		m.peers[c.peer] = p
		p.timer = time.AfterFunc(p.interval, func() { m.probe(p) })
	}
	p.interval = min(p.interval, c.keepAlive)
	p.conns[c] = struct{}{}
}

// detachPeer removes a connection from its peer's keep-alive; the last one stops it.
func (m *manager) detachPeer(c *conn) {
	p := m.peers[c.peer]
	if p == nil {
		return
	}
	if _, ok := p.conns[c]; !ok {
		return
	}
	delete(p.conns, c)
	if len(p.conns) == 0 {
		p.timer.Stop()
		delete(m.peers, c.peer)
	}
}

// probe sends the peer device a keep-alive, or gives up on it after KeepAliveMisses
// unanswered ones (its own goroutine).
func (m *manager) probe(p *peer) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || m.peers[p.addr] != p {
		return
	}
	if p.missed >= KeepAliveMisses {
		m.stats.PeersLost++
		delete(m.peers, p.addr)
		for c := range p.conns {
			c.logEvent(slog.LevelWarn, evPeerGone, fmt.Sprintf("%d keep-alive probes unanswered, %v apart", p.missed, p.interval))
			if c.state == stDreqSent {
				c.discErr = ErrPeerUnreachable // Disconnect waits for a DREP that will not come
			}
			c.toErr()
			c.end(ErrPeerUnreachable)
			c.timewait()
		}
		return
	}
	p.missed++
	p.tid++
	m.stats.KeepAliveProbes++
	mad.PutClassPortInfoGet(m.out[:], p.tid)
	mad.PutIncarnation(m.out[:], m.guid) // the answer then carries the peer's (incarnation.go)
	m.send(p.addr, m.out[:])
	p.timer.Reset(p.interval)
}

package cm

import (
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"net/netip"
	"sync"
	"time"

	"github.com/softrnic/softrnic/internal/gsiport"
	"github.com/softrnic/softrnic/internal/mad"
	"github.com/softrnic/softrnic/verbs"
)

// Limits of one device's connection manager.
const (
	// Backlog is how many ConnectRequests a listener holds before Accept takes them.
	Backlog = 4096
	// MaxREQInFlight is how many ConnectRequests a device has waiting for an answer.
	MaxREQInFlight = 64
	// KeepAliveMisses is how many keep-alive probes in a row a peer device may leave
	// unanswered before its connections end with ErrPeerUnreachable.
	KeepAliveMisses = 5
)

// Defaults of DialParams and AcceptParams.
const (
	DefaultResponseTimeout = time.Second
	DefaultMaxRetries      = 15
	DefaultKeepAlive       = time.Second
)

// manager is the connection manager of one device: it owns the device's QP1 handler and
// every connection's state. All state is guarded by mu; MADs are handled in QP1's agent
// goroutine, timers in their own, API calls in the caller's; none of them blocks while
// holding mu (sends on QP1 and QP modifications are quick and do not wait for the peer).
type manager struct {
	dev   *verbs.Device
	port  gsiport.Port
	local netip.AddrPort
	guid  uint64 // the device's CA GUID in REQ and REP: its incarnation (incarnation.go)

	reqSlots chan struct{} // MaxREQInFlight tokens

	mu        sync.Mutex
	closed    bool
	ids       map[uint32]*conn     // every connection by local communication ID
	byRemote  map[remoteKey]*conn  // by the peer device and its communication ID
	byQP      map[remoteKey]*conn  // established, by the peer device and its QPN
	listeners map[uint16]*Listener // by service port
	peers     map[netip.AddrPort]*peer
	incs      map[netip.AddrPort]*remoteInc // softrnic peer devices' incarnations (incarnation.go)
	stats     Counters
	out       [mad.Size]byte // scratch for messages sent once (mu held)
	sidr      *sidrTable     // service ID resolution (sidr.go), made on first use
}

// remoteKey names a peer's communication ID or QP number at its device.
type remoteKey struct {
	addr netip.AddrPort
	id   uint32
}

// Counters count the messages a device's connection manager sent and received.
type Counters struct {
	REQSent, REQRetries, REQDuplicates      uint64
	REPSent, REPRetries, RTUSent            uint64
	MRASent, MRAReceived                    uint64
	REJSent, REJReceived                    uint64
	DREQSent, DREQRetries, DREPSent         uint64
	Established, Disconnected, StaleRejects uint64
	// Dropped counts MADs that were malformed, of an unknown kind, or matched no
	// connection (from an address other than the connection's peer included).
	Dropped uint64
	// BacklogDrops counts ConnectRequests dropped because a listener's backlog was full.
	BacklogDrops uint64
	// KeepAliveProbes counts probes sent; PeersLost the peer devices given up on.
	KeepAliveProbes, PeersLost uint64
	// PeerRestarts counts the times a peer device this one had connections with was
	// found replaced by a new one at its address (another incarnation): those
	// connections ended with ErrPeerRestarted.
	PeerRestarts uint64
	// SendErrors counts MADs that QP1 could not send.
	SendErrors uint64
}

var (
	managersMu sync.Mutex
	managers   = map[*verbs.Device]*manager{}
)

// managerFor returns the device's connection manager, claiming its QP1 on first use.
func managerFor(dev *verbs.Device) (*manager, error) {
	if dev == nil {
		return nil, errors.New("cm: nil device")
	}
	managersMu.Lock()
	defer managersMu.Unlock()
	if m := managers[dev]; m != nil {
		return m, nil
	}
	port, err := gsiport.Lookup(dev)
	if errors.Is(err, verbs.ErrClosed) {
		return nil, errDeviceClosed
	}
	if err != nil {
		return nil, err
	}
	m := newManager(dev, port)
	if err := port.Claim(m); err != nil {
		return nil, err
	}
	managers[dev] = m
	return m, nil
}

func newManager(dev *verbs.Device, port gsiport.Port) *manager {
	return &manager{dev: dev, port: port, local: port.LocalAddr(), guid: port.Incarnation(),
		reqSlots: make(chan struct{}, MaxREQInFlight),
		ids:      map[uint32]*conn{}, byRemote: map[remoteKey]*conn{}, byQP: map[remoteKey]*conn{},
		listeners: map[uint16]*Listener{}, peers: map[netip.AddrPort]*peer{}, incs: map[netip.AddrPort]*remoteInc{}}
}

// DeviceCounters returns the counters of dev's connection manager (zero if it has none),
// as dev.Counters() returns the device's packet counters.
func DeviceCounters(dev *verbs.Device) Counters {
	managersMu.Lock()
	m := managers[dev]
	managersMu.Unlock()
	if m == nil {
		return Counters{}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stats
}

func randUint64() uint64 {
	var b [8]byte
	_, _ = crand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}

// newID returns an unused local communication ID (random, never 0; mu held).
func (m *manager) newID() uint32 {
	for {
		id := uint32(randUint64())
		if id != 0 && m.ids[id] == nil {
			return id
		}
	}
}

// send sends the MAD b to the peer's QP1 (mu held).
func (m *manager) send(to netip.AddrPort, b []byte) {
	if err := m.port.SendMAD(to, 1, b); err != nil {
		m.stats.SendErrors++
	}
}

// sendOnce encodes msg with tid and sends it, not keeping it (mu held).
func (m *manager) sendOnce(to netip.AddrPort, tid uint64, msg mad.Message) {
	mad.Put(m.out[:], tid, msg)
	m.send(to, m.out[:])
}

// HandleMAD is QP1's receive path (gsiport.Handler): every MAD from the wire, checked and
// matched before it touches a connection.
func (m *manager) HandleMAD(src netip.AddrPort, srcQP uint32, b []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	h, err := mad.DecodeHeader(b)
	if err != nil {
		m.stats.Dropped++
		return
	}
	if p := m.peers[src]; p != nil {
		p.missed = 0 // anything from the device shows it is alive
	}
	if h.AttrID == mad.AttrClassPortInfo {
		// A softrnic peer's probe and answer carry its incarnation; the answer carries
		// ours only to a probe that carried one (a standard CM sees what it always did).
		inc := classPortInfoIncarnation(b)
		m.seeIncarnation(src, inc)
		switch h.Method {
		case mad.MethodGet:
			mad.PutClassPortInfoResp(m.out[:], h.TID, 16)
			if inc != 0 {
				mad.PutIncarnation(m.out[:], m.guid)
			}
			m.port.SendMAD(src, srcQP, m.out[:])
		case mad.MethodGetResp:
		default:
			m.stats.Dropped++
		}
		return
	}
	if h.Method != mad.MethodSend || srcQP != 1 {
		m.stats.Dropped++
		return
	}
	var ok bool
	switch h.AttrID {
	case mad.AttrREQ:
		var req mad.REQ
		if _, err := mad.Decode(b, &req); err == nil {
			ok = m.onREQ(src, h.TID, &req)
		}
	case mad.AttrMRA:
		var mra mad.MRA
		if _, err := mad.Decode(b, &mra); err == nil {
			ok = m.onMRA(src, &mra)
		}
	case mad.AttrREJ:
		var rej mad.REJ
		if _, err := mad.Decode(b, &rej); err == nil {
			ok = m.onREJ(src, &rej)
		}
	case mad.AttrREP:
		var rep mad.REP
		if _, err := mad.Decode(b, &rep); err == nil {
			ok = m.onREP(src, &rep)
		}
	case mad.AttrRTU:
		var rtu mad.RTU
		if _, err := mad.Decode(b, &rtu); err == nil {
			ok = m.onRTU(src, &rtu)
		}
	case mad.AttrDREQ:
		var dreq mad.DREQ
		if _, err := mad.Decode(b, &dreq); err == nil {
			ok = m.onDREQ(src, h.TID, &dreq)
		}
	case mad.AttrDREP:
		var drep mad.DREP
		if _, err := mad.Decode(b, &drep); err == nil {
			ok = m.onDREP(src, &drep)
		}
	case mad.AttrSIDRREQ:
		var r mad.SIDRREQ
		if _, err := mad.Decode(b, &r); err == nil {
			ok = m.onSIDRREQ(src, h.TID, &r)
		}
	case mad.AttrSIDRREP:
		var r mad.SIDRREP
		if _, err := mad.Decode(b, &r); err == nil {
			ok = m.onSIDRREP(src, h.TID, &r)
		}
	}
	if !ok {
		m.stats.Dropped++
	}
}

// lookup returns the connection a message from src names by our communication ID.
func (m *manager) lookup(src netip.AddrPort, id uint32) *conn {
	c := m.ids[id]
	if c == nil || !c.from(src) {
		return nil
	}
	return c
}

// RoCEv2Port is the UDP port every RoCEv2 packet is sent to. A standard peer (Linux rxe,
// a RoCE NIC) sends its MADs from a source port of its own (flow entropy, like its QPs'
// packets) and listens only on this one, so a MAD to it always goes here.
const RoCEv2Port = 4791

// peerOf returns the device address the connection a REQ opens talks to: a softrnic
// device (the REQ carries the extension) sends its MADs from its device port, which may
// be any; a standard peer is reached at RoCEv2Port, whatever port its REQ came from.
func peerOf(src netip.AddrPort, soft bool) netip.AddrPort {
	if soft {
		return src
	}
	return netip.AddrPortFrom(src.Addr(), RoCEv2Port)
}

// Closing ends everything as the device closes (gsiport.Handler): established
// connections are sent one DisconnectRequest, waiters get ErrClosed.
func (m *manager) Closing() {
	managersMu.Lock()
	delete(managers, m.dev)
	managersMu.Unlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	for _, c := range m.ids {
		if c.state == stEstablished {
			c.sendDREQ()
		}
		c.stopTimer()
		c.finish(errDeviceClosed)
		c.end(errDeviceClosed)
		if c.discDone != nil {
			c.discErr = errDeviceClosed
			close(c.discDone)
			c.discDone = nil
		}
		c.state = stGone
	}
	for _, l := range m.listeners {
		l.closeLocked()
	}
	m.closeSIDR()
	for _, p := range m.peers {
		p.timer.Stop()
	}
}

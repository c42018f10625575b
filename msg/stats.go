package msg

import (
	"fmt"
	"time"

	"github.com/softrnic/softrnic/cm"
)

// Stats counts what a rank's connections did: what a program or an operator watches.
type Stats struct {
	EagerSent, EagerReceived   uint64 // messages that went through the rings
	RendezvousSent, Rendezvous uint64 // rendezvous sends, and receives (the sender RDMA-WRITEs into the receive buffer)
	Enlargements               uint64 // control messages sent asking a peer for a larger ring
	EnlargementsServed         uint64 // rings enlarged at a peer's request
	AckResends                 uint64 // enlargement acknowledgements asked for again (lost, corrupt or late)
	CreditMessages             uint64 // credits given back in messages of their own, not with a message
	Connections                uint64 // connections made
}

// LabStats are what an experiment on the enlargement protocol measures: how the send
// routine behaved while a connection grew, and where the time of the last enlargement
// went. Programs have no use for them; rmsg enlarge reports them.
type LabStats struct {
	ZeroByteReports uint64 // times the send routine reported 0 bytes transferred (waiting for an enlargement)
	PrefixSends     uint64 // vectors whose prefix went before a larger element
	AckPartialSeen  uint64 // polls that found a partial acknowledgement
	// LastEnlargement is where the time of the rank's last enlargement went, in each of
	// its two roles.
	LastEnlargement EnlargementTimes
}

// EnlargementTimes times the steps of an enlargement, as the rank saw them: the sender
// asks for larger slots and waits for the acknowledgement, the receiver provisions its
// larger ring and acknowledges, the sender provisions its larger staging buffers and
// sends. Zero where the rank has not had that role yet.
type EnlargementTimes struct {
	// The sender's: from writing the control message (its post included) to reading a
	// complete acknowledgement (a round trip, with the receiver's Serve and AckPost in
	// it); its own provisioning (the small staging buffers unregistered, the large ones
	// registered); and from writing the control message to the return of the
	// first post through the larger slots.
	AckWait, Provision, ToFirstSend time.Duration
	// The receiver's: its provisioning (the small ring unregistered, the large one
	// registered), and the acknowledgement's post (the WRITE with immediate).
	Serve, AckPost time.Duration
}

// Stats returns the rank's counters.
func (c *Comm) Stats() Stats {
	var s Stats
	c.call(func() { s = c.stats })
	return s
}

// LabStats returns the rank's counters and timings of the enlargement protocol.
func (c *Comm) LabStats() LabStats {
	var s LabStats
	c.call(func() { s = c.lab })
	return s
}

// PeerMemory is what one connection holds registered.
type PeerMemory struct {
	Rank int
	// RecvPhase is the phase of the ring this rank receives into; SendPhase that of the
	// peer's ring it sends into.
	RecvPhase, SendPhase int
	// RecvRing, SendStage and Control are the bytes registered for the receive ring,
	// the staging buffers, and the acknowledgement areas.
	RecvRing, SendStage, Control int
}

// Total is the connection's registered bytes.
func (p PeerMemory) Total() int { return p.RecvRing + p.SendStage + p.Control }

// Memory is what a rank holds registered.
type Memory struct {
	Connections int
	// Registered is every connection's registered bytes; RegCache the user buffers the
	// registration cache holds.
	Registered, RegCache int
	Peers                []PeerMemory // connections made or being made (or failed, until Close), by rank
}

// Memory reports the rank's registered memory, per connection and phase.
func (c *Comm) Memory() Memory {
	var m Memory
	c.call(func() {
		for _, p := range c.peers {
			if p == nil || p.qp == nil {
				continue // no connection (or this rank itself)
			}
			pm := PeerMemory{Rank: p.rank, RecvPhase: p.phase, SendPhase: p.rPhase, Control: p.ackMR.Len()}
			if p.ring != nil {
				pm.RecvRing = p.ring.Len()
			}
			if p.stage != nil {
				pm.SendStage = p.stage.Len()
			}
			m.Peers = append(m.Peers, pm)
			m.Connections++
			m.Registered += pm.Total()
		}
		m.RegCache = c.regs.bytes
	})
	return m
}

// debugState describes the rank's connections, for a test that failed.
func (c *Comm) debugState() string {
	s := ""
	c.call(func() {
		dc := c.dev.Counters()
		s = fmt.Sprintf("device %v: unknown QP %d, ICRC %d, malformed %d\n", c.dev.Addr(), dc.UnknownQP, dc.ICRCErrors, dc.Malformed)
		s += fmt.Sprintf("rank %d: %d posted, %d unexpected, %d active; cm %+v\n", c.rank, len(c.posted), len(c.unexpected), len(c.active), cm.DeviceCounters(c.dev))
		for _, p := range c.peers {
			if p == nil || p.qp == nil {
				continue
			}
			a, _ := p.qp.QueryQP()
			dial := uint32(0)
			if p.dialQP != nil {
				dial = p.dialQP.QPNum()
			}
			s += fmt.Sprintf("  peer %d: state %d qp %#x (%v, to %#x) dialQP %#x credits %d sendQ %d ctlSent %v owed %d sqUsed %d stageFree %d phase %d/%d recvSeq %d sendSeq %d err %v\n",
				p.rank, p.state, p.qp.QPNum(), a.QPState, a.DestQPNum, dial, p.credits, len(p.sendQ), p.ctlSent, p.owed, p.sqUsed, len(p.stageFree), p.phase, p.rPhase, p.recvSeq, p.sendSeq, p.err)
			s += fmt.Sprintf("    to port %d (src %d); transport %+v\n", a.AHAttr.DestPort, a.AHAttr.SrcPort, p.qp.Counters())
		}
	})
	return s
}

// LargeFromStart is what one connection would hold registered if it used cfg's largest
// phase from the start (as MPI libraries' fixed eager buffers do): the figure the
// per-connection memory of enlargement is compared with.
func LargeFromStart(cfg Config) int {
	if err := cfg.defaults(); err != nil {
		return 0
	}
	big := cfg.Phases[len(cfg.Phases)-1]
	return cfg.Slots*big + cfg.SendSlots*big + ackAreaLen
}

package transport

// Stats are a QP's or a device's packet counters.
type Stats struct {
	TxPackets, TxBytes uint64 // packets and bytes sent (headers included)
	RxPackets, RxBytes uint64 // packets and bytes received
	Retransmits        uint64 // request packets sent again
	NAKsSent, NAKsRecv uint64 // NAKs other than RNR, sent and received
	RNRNAKsSent        uint64
	RNRNAKsRecv        uint64
	Duplicates         uint64 // duplicate requests and responses received
	OutOfSequence      uint64 // requests ahead of the expected PSN, and responses out of order
	Timeouts           uint64 // local ACK timeouts that fired
	WrongSource        uint64 // packets from an address other than the QP's peer
	WrongMode          uint64 // packets whose opcode the QP's ordering mode does not use
	Dropped            uint64 // packets dropped for the QP's state or a protocol error
	QKeyErrors         uint64 // UD datagrams carrying another Q_Key
	Unreachable        uint64 // failures because the peer's host reported its port closed (unreach.go)

	// Weakly-ordered mode.
	PlacedOutOfOrder     uint64 // request packets placed while an earlier PSN was missing
	HolesOpened          uint64 // holes in the request and response PSN streams
	HolesClosed          uint64
	SACKsSent            uint64 // selective acknowledgements
	SACKsRecv            uint64
	SelectiveRetransmits uint64 // packets retransmitted alone, found lost by SACK or timer
	BeyondSpan           uint64 // packets dropped for lying past the arrival bitmap

	// Device-wide receive-path drops (zero in a QP's counters).
	ICRCErrors uint64 // bad ICRC
	Malformed  uint64 // undecodable headers, bad P_Key
	UnknownQP  uint64 // destination QP does not exist
	// DirectPlaced counts RDMA WRITE packets whose payload was copied into place in the
	// same pass as their ICRC check (the receive path's header/data split, device only).
	DirectPlaced uint64
}

func (s *Stats) add(o *Stats) {
	s.TxPackets += o.TxPackets
	s.TxBytes += o.TxBytes
	s.RxPackets += o.RxPackets
	s.RxBytes += o.RxBytes
	s.Retransmits += o.Retransmits
	s.NAKsSent += o.NAKsSent
	s.NAKsRecv += o.NAKsRecv
	s.RNRNAKsSent += o.RNRNAKsSent
	s.RNRNAKsRecv += o.RNRNAKsRecv
	s.Duplicates += o.Duplicates
	s.OutOfSequence += o.OutOfSequence
	s.Timeouts += o.Timeouts
	s.WrongSource += o.WrongSource
	s.WrongMode += o.WrongMode
	s.Dropped += o.Dropped
	s.QKeyErrors += o.QKeyErrors
	s.Unreachable += o.Unreachable
	s.PlacedOutOfOrder += o.PlacedOutOfOrder
	s.HolesOpened += o.HolesOpened
	s.HolesClosed += o.HolesClosed
	s.SACKsSent += o.SACKsSent
	s.SACKsRecv += o.SACKsRecv
	s.SelectiveRetransmits += o.SelectiveRetransmits
	s.BeyondSpan += o.BeyondSpan
	s.ICRCErrors += o.ICRCErrors
	s.Malformed += o.Malformed
	s.UnknownQP += o.UnknownQP
}

// Stats returns the QP's counters.
func (q *QP) Stats() Stats {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.statsLocked()
}

func (q *QP) statsLocked() Stats {
	s := q.stats
	opened, closed := q.weak.holeCounts()
	s.HolesOpened += opened
	s.HolesClosed += closed
	return s
}

// Stats returns the device's counters: its receive-path drops plus the sum over all QPs,
// live and destroyed. Receive counters include packets dropped before reaching a QP.
func (d *Device) Stats() Stats {
	var s Stats
	d.qpMu.Lock()
	s = d.retired
	live := make([]*QP, 0, len(d.qpSet))
	for q := range d.qpSet {
		live = append(live, q)
	}
	d.qpMu.Unlock()
	for _, q := range live {
		qs := q.Stats()
		s.add(&qs)
	}
	// Receive counters are the queues': they include packets dropped before a QP.
	s.RxPackets, s.RxBytes, s.ICRCErrors, s.Malformed, s.UnknownQP = 0, 0, 0, 0, 0
	for _, u := range d.queues {
		u.rxMu.Lock()
		s.RxPackets += u.rx.packets
		s.RxBytes += u.rx.bytes
		s.ICRCErrors += u.rx.icrc
		s.Malformed += u.rx.malformed + u.rx.pkey
		s.UnknownQP += u.rx.unknownQP + u.rx.misrouted
		s.DirectPlaced += u.rx.direct
		u.rxMu.Unlock()
	}
	return s
}

// QueueStats are one receive queue's counters.
type QueueStats struct {
	// RxPackets and RxBytes count what the queue's socket received (RoCEv2 packets,
	// GRO batches split).
	RxPackets, RxBytes uint64
	// Misrouted counts packets for a QP of another queue (the kernel steers by QP, so
	// only a peer's crafted or stale packet): dropped, as packets for an unknown QP.
	Misrouted uint64
	// RecvCalls counts the queue's receive system calls that returned packets.
	RecvCalls uint64
}

// QueueStats returns each receive queue's counters.
func (d *Device) QueueStats() []QueueStats {
	out := make([]QueueStats, len(d.queues))
	for i, u := range d.queues {
		u.rxMu.Lock()
		out[i] = QueueStats{RxPackets: u.rx.packets, RxBytes: u.rx.bytes, Misrouted: u.rx.misrouted}
		u.rxMu.Unlock()
		out[i].RecvCalls = u.conn.RecvCalls.Load()
	}
	return out
}

// Package gsiport is the seam between a device's QP1 (the general services interface, owned
// by package verbs) and the connection manager (package cm) that speaks CM MADs over it.
//
// verbs cannot import cm (cm is built on verbs), and QP1 is not part of the verbs API that
// users see, so verbs registers Lookup at init and cm reaches a device's QP1 through it.
package gsiport

import "net/netip"

// Handler receives the MADs that arrive on QP1 once it has claimed the port.
type Handler interface {
	// HandleMAD is called for each datagram of MAD size that arrived on QP1, in arrival
	// order, from the one goroutine that serves QP1: src is the sending device's address
	// and UDP port, srcQP its QP (1 for a CM). m is valid only during the call. HandleMAD
	// must not block: QP1's receive queue refills only after it returns.
	HandleMAD(src netip.AddrPort, srcQP uint32, m []byte)
	// Closing is called once, as the device closes and before its socket is shut, so that
	// the handler may send its last MADs (DisconnectRequests) and fail what waits on it.
	Closing()
}

// UnreachableHandler is a Handler that also hears when the host of a MAD's destination
// answered it with ICMP port unreachable: nothing listens on that UDP port there, so no
// device runs at that address (reported on Linux only; elsewhere the MAD is lost in
// silence).
type UnreachableHandler interface {
	Handler
	// PortUnreachable is called from the goroutine that calls HandleMAD: dst is the
	// MAD's destination and m what the report quotes of the MAD (its start, possibly
	// less than its header), valid only during the call. The report may be forged by
	// anyone who can send this host ICMP: the handler acts on it only if m matches a
	// MAD it sent to dst and still waits on.
	PortUnreachable(dst netip.AddrPort, m []byte)
}

// Port is a device's QP1 as a MAD user sees it.
type Port interface {
	// SendMAD sends the MAD m (256 bytes) to QP qpn at dst with the GSI Q_Key. It may
	// be called from any goroutine, HandleMAD included; it does not wait for the
	// peer. A datagram may be lost: the caller retries on its own timers.
	SendMAD(dst netip.AddrPort, qpn uint32, m []byte) error
	// LocalAddr is the device's address and UDP port.
	LocalAddr() netip.AddrPort
	// Incarnation is a random number (never 0) drawn when the device opened: a new device
	// at the same address and port has another one, so peers can tell it from the old.
	Incarnation() uint64
	// Claim makes h the receiver of the port's MADs. A port has at most one handler:
	// Claim fails if another one was set.
	Claim(h Handler) error
}

// Lookup returns the QP1 of a device (a *verbs.Device). Package verbs sets it at init.
var Lookup func(dev any) (Port, error)

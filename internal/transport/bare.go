package transport

import "net/netip"

// bareIO makes a device one without sockets, as the role tests build it to drive a QP's
// requester, completer and responder packet by packet (rig_test.go): every packet the
// device emits is handed to capture, whole, instead of being sent (Device.send drops the
// batches); its receive queues read no socket (queue.poll), so it receives only the
// packets a test puts into its receive path; and its clock stands still at clock (device
// time, ns) unless the test moves it, so that its timers fire when the test runs them
// (timerQueue.expire). Closing it closes no socket. A device opened on its sockets (Open)
// has none of this.
type bareIO struct {
	capture func(to netip.AddrPort, pkt []byte)
	clock   int64
}

// emitted hands capture a copy of the packet emitTo completed: hdr, the payload pieces
// and trailer (pad and ICRC), to to.
func (b *bareIO) emitted(to netip.AddrPort, hdr []byte, pay [][]byte, trailer []byte) {
	n := len(hdr) + len(trailer)
	for _, p := range pay {
		n += len(p)
	}
	pkt := make([]byte, 0, n)
	pkt = append(pkt, hdr...)
	for _, p := range pay {
		pkt = append(pkt, p...)
	}
	b.capture(to, append(pkt, trailer...))
}

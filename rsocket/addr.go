package rsocket

import "net/netip"

// Addr is an rsocket's address: an IP address and a port. A listener's address, and
// the remote address of a dialled connection, carry the service port (rdma_cm's TCP
// port space, as rsockets use); the other end of a connection is a device: its IP
// address and UDP port, which tell one client from another as a TCP client's ephemeral
// port does.
type Addr struct {
	AddrPort netip.AddrPort
}

// Network returns "rsocket".
func (a *Addr) Network() string { return "rsocket" }

func (a *Addr) String() string { return a.AddrPort.String() }

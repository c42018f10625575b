package transport

import (
	"net/netip"

	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/wire"
)

// AH is an address handle: where a UD QP's datagrams to one peer device go, resolved once
// (the socket address and the flow its ICRC covers).
type AH struct {
	addr netio.Addr
	flow wire.Flow
}

// NewAH resolves an address handle for the device at peer (IP and UDP port).
func (d *Device) NewAH(peer netip.AddrPort) (*AH, error) {
	a, err := d.conn.MakeAddr(peer)
	if err != nil {
		return nil, err
	}
	local := d.local
	return &AH{addr: a, flow: wire.Flow{Src: local.Addr(), Dst: a.AP.Addr(), SrcPort: local.Port(), DstPort: a.AP.Port(), DF: d.v4}}, nil
}

// Peer returns the address the handle sends to.
func (a *AH) Peer() netip.AddrPort { return a.addr.AP }

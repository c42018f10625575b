package mad

import (
	"encoding/binary"
	"errors"
	"net/netip"
)

// The rdma_cm (librdmacm) conventions on top of IB CM, so that a Linux rdma_cm peer
// understands a softrnic connection: the service ID of the TCP port space, and the IP
// addressing header (IBTA Annex A11, "IP CM") at the start of a REQ's private data.

// PortSpaceTCP is rdma_cm's RDMA_PS_TCP: service IDs 0x0000000001060000 | port.
const PortSpaceTCP = 0x0106

// ServiceID returns the service ID of port in the TCP port space.
func ServiceID(port uint16) uint64 { return PortSpaceTCP<<16 | uint64(port) }

// ServicePort returns the port of a TCP-port-space service ID, and false for any other.
func ServicePort(id uint64) (uint16, bool) {
	if id>>16 != PortSpaceTCP {
		return 0, false
	}
	return uint16(id), true
}

// CMAHeaderLen is the size of the addressing header; what a REQ's private data has left
// after it is what a connecting application may send (56 bytes, as librdmacm allows).
const (
	CMAHeaderLen     = 36
	CMAPrivateMax    = REQPrivateLen - CMAHeaderLen
	AcceptPrivateMax = REPPrivateLen
	RejectPrivateMax = REJPrivateLen
)

// CMAHeader is the addressing header: IP version, the connecting side's port, and the
// source and destination IP addresses (both of one family).
type CMAHeader struct {
	SrcPort  uint16
	Src, Dst netip.Addr
}

// ErrCMAHeader is returned for an addressing header of an unknown version or family.
var ErrCMAHeader = errors.New("mad: not an rdma_cm IP addressing header (version 0, IPv4 or IPv6)")

// Put writes h into b[:CMAHeaderLen]: version 0.0, the IP version in the upper four bits
// of the second byte, the port, and each address in 16 bytes (IPv4 in the last four,
// the first twelve zero).
func (h *CMAHeader) Put(b []byte) {
	_ = b[CMAHeaderLen-1]
	clear(b[:CMAHeaderLen])
	b[1] = 6 << 4
	if h.Src.Is4() || h.Src.Is4In6() {
		b[1] = 4 << 4
	}
	binary.BigEndian.PutUint16(b[2:], h.SrcPort)
	putIP(b[4:20], h.Src)
	putIP(b[20:36], h.Dst)
}

func putIP(b []byte, a netip.Addr) {
	if a.Is4() || a.Is4In6() {
		v := a.Unmap().As4()
		copy(b[12:16], v[:])
		return
	}
	v := a.As16()
	copy(b, v[:])
}

// DecodeCMAHeader reads an addressing header from the start of private data.
func DecodeCMAHeader(b []byte) (CMAHeader, error) {
	if len(b) < CMAHeaderLen || b[0] != 0 {
		return CMAHeader{}, ErrCMAHeader
	}
	h := CMAHeader{SrcPort: binary.BigEndian.Uint16(b[2:])}
	switch b[1] >> 4 {
	case 4:
		h.Src = netip.AddrFrom4([4]byte(b[16:20]))
		h.Dst = netip.AddrFrom4([4]byte(b[32:36]))
	case 6:
		h.Src = netip.AddrFrom16([16]byte(b[4:20]))
		h.Dst = netip.AddrFrom16([16]byte(b[20:36]))
	default:
		return CMAHeader{}, ErrCMAHeader
	}
	return h, nil
}

// GID returns the GID of an IP address as RoCEv2 uses it (IPv4-mapped for IPv4).
func GID(a netip.Addr) [16]byte { return a.As16() }

// softrnic marks its own requests in fields a standard CM does not read, so that the
// receiving side knows to answer at the port the request came from (a softrnic device's
// port, which may be any) rather than at 4791, where a standard peer listens.
const (
	// SoftrnicEECNMark is the bit of a REQ's or REP's Local EECN (reserved for RC) that
	// says the rest of the field is softrnic's extension (package cm).
	SoftrnicEECNMark = 1 << 23
	// SoftrnicSIDRMark is a softrnic SIDR_REQ's reserved field after the P_Key.
	SoftrnicSIDRMark = 0x5352
)

// FromSoftrnic reports whether the request carries softrnic's mark.
func (r *REQ) FromSoftrnic() bool { return r.LocalEECN&SoftrnicEECNMark != 0 }

// FromSoftrnic reports whether the request carries softrnic's mark.
func (r *SIDRREQ) FromSoftrnic() bool { return r.Reserved == SoftrnicSIDRMark }

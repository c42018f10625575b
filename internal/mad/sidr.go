package mad

import "encoding/binary"

// Service ID resolution (SIDR, IBTA Vol. 1 12.11): how a UD service is found. The
// requester sends a ServiceIDResolutionRequest naming a service ID; the CM of the device
// that provides it answers with a ServiceIDResolutionResponse carrying the UD QP number
// and Q_Key to send datagrams to. There is no connection: a request ID matches the
// response to its request, and nothing follows.

// Private data and additional information sizes of SIDR_REQ and SIDR_REP (IBTA Tables
// 119 and 120).
const (
	SIDRREQPrivateLen = 216
	SIDRREPPrivateLen = 136
	SIDRREPInfoLen    = 72
)

// SIDR_REP status values (IBTA Table 120).
const (
	SIDRSuccess            = 0 // the QPN and Q_Key are valid
	SIDRUnsupported        = 1 // service ID not supported (nothing serves it here)
	SIDRReject             = 2 // the service provider rejected the request
	SIDRNoQP               = 3 // no QP available
	SIDRRedirect           = 4 // go to the CM named by the ClassPortInfo in Info
	SIDRUnsupportedVersion = 5 // the class version is not supported
)

// SIDRREQ is ServiceIDResolutionRequest (IBTA Table 119).
type SIDRREQ struct {
	RequestID uint32
	PKey      uint16
	// Reserved is the 16 bits after the P_Key that IBTA reserves. softrnic's connection
	// manager marks its own requests here (a standard CM does not read the field).
	Reserved    uint16
	ServiceID   uint64
	PrivateData [SIDRREQPrivateLen]byte
}

// Attr returns AttrSIDRREQ.
func (*SIDRREQ) Attr() AttrID { return AttrSIDRREQ }

func (m *SIDRREQ) put(d []byte) {
	binary.BigEndian.PutUint32(d[0:], m.RequestID)
	binary.BigEndian.PutUint16(d[4:], m.PKey)
	binary.BigEndian.PutUint16(d[6:], m.Reserved)
	binary.BigEndian.PutUint64(d[8:], m.ServiceID)
	copy(d[16:16+SIDRREQPrivateLen], m.PrivateData[:])
}

func (m *SIDRREQ) get(d []byte) error {
	m.RequestID = binary.BigEndian.Uint32(d[0:])
	m.PKey = binary.BigEndian.Uint16(d[4:])
	m.Reserved = binary.BigEndian.Uint16(d[6:])
	m.ServiceID = binary.BigEndian.Uint64(d[8:])
	copy(m.PrivateData[:], d[16:16+SIDRREQPrivateLen])
	return nil
}

// SIDRREP is ServiceIDResolutionResponse (IBTA Table 120). The Vendor ID bits around
// the QPN (later IBTA revisions name them; Linux sends them as zero) go out as zero and
// are not read.
type SIDRREP struct {
	RequestID  uint32
	Status     uint8
	InfoLength uint8  // bytes of Info used (at most SIDRREPInfoLen)
	QPN        uint32 // 24 bits
	ServiceID  uint64
	QKey       uint32
	// Info is the additional information: the ClassPortInfo of the CM to go to when the
	// status is SIDRRedirect.
	Info        [SIDRREPInfoLen]byte
	PrivateData [SIDRREPPrivateLen]byte
}

// Attr returns AttrSIDRREP.
func (*SIDRREP) Attr() AttrID { return AttrSIDRREP }

func (m *SIDRREP) put(d []byte) {
	binary.BigEndian.PutUint32(d[0:], m.RequestID)
	d[4], d[5] = m.Status, m.InfoLength
	put24(d, 8, m.QPN)
	binary.BigEndian.PutUint64(d[12:], m.ServiceID)
	binary.BigEndian.PutUint32(d[20:], m.QKey)
	copy(d[24:24+SIDRREPInfoLen], m.Info[:])
	copy(d[96:96+SIDRREPPrivateLen], m.PrivateData[:])
}

func (m *SIDRREP) get(d []byte) error {
	m.RequestID = binary.BigEndian.Uint32(d[0:])
	m.Status, m.InfoLength = d[4], d[5]
	m.QPN = get24(d, 8)
	m.ServiceID = binary.BigEndian.Uint64(d[12:])
	m.QKey = binary.BigEndian.Uint32(d[20:])
	copy(m.Info[:], d[24:24+SIDRREPInfoLen])
	copy(m.PrivateData[:], d[96:96+SIDRREPPrivateLen])
	if m.InfoLength > SIDRREPInfoLen {
		return ErrField
	}
	return nil
}

// rdma_cm's UDP port space (RDMA_PS_UDP), whose services are resolved by SIDR: service
// IDs 0x0000000001110000 | port, the same addressing header as a REQ's at the start of
// the SIDR_REQ's private data (so that 180 bytes are left to the application), and the
// Q_Key every rdma_cm UD QP of the port space uses (RDMA_UDP_QKEY).
const (
	PortSpaceUDP   = 0x0111
	UDPQKey        = 0x01234567
	SIDRPrivateMax = SIDRREQPrivateLen - CMAHeaderLen
)

// UDPServiceID returns the service ID of port in the UDP port space.
func UDPServiceID(port uint16) uint64 { return PortSpaceUDP<<16 | uint64(port) }

// UDPServicePort returns the port of a UDP-port-space service ID, and false for any other.
func UDPServicePort(id uint64) (uint16, bool) {
	if id>>16 != PortSpaceUDP {
		return 0, false
	}
	return uint16(id), true
}

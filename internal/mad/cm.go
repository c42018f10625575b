package mad

import "encoding/binary"

// Message is a CM message: its attribute ID, and its fields put into and read from the
// data part of a MAD (the DataLen bytes after the common header).
type Message interface {
	Attr() AttrID
	put(d []byte)
	get(d []byte) error
}

// Put encodes m with transaction ID tid into b (Size bytes): a CM MAD of method Send.
func Put(b []byte, tid uint64, m Message) {
	_ = b[Size-1]
	clear(b[:Size])
	h := cmHeader(tid, m.Attr())
	h.Put(b)
	m.put(b[HeaderLen:Size])
}

// Decode decodes the CM MAD b into m; the header's attribute must be m's.
func Decode(b []byte, m Message) (Header, error) {
	h, err := DecodeHeader(b)
	if err != nil {
		return h, err
	}
	if h.AttrID != m.Attr() {
		return h, ErrAttr
	}
	return h, m.get(b[HeaderLen:])
}

// Private data sizes of each message (IBTA Tables 106-113).
const (
	REQPrivateLen  = 92
	MRAPrivateLen  = 222
	REJPrivateLen  = 148
	REJInfoLen     = 72
	REPPrivateLen  = 196
	RTUPrivateLen  = 224
	DREQPrivateLen = 220
	DREPPrivateLen = 224
)

// Transport service types in a REQ.
const (
	TransportRC = 0
	TransportUC = 1
)

// Path is a path of a REQ (primary or alternate): for RoCE, the GIDs are the IP
// addresses (IPv4-mapped for IPv4) and the LIDs are the permissive LID 0xFFFF or 0.
type Path struct {
	LocalLID, RemoteLID uint16
	LocalGID, RemoteGID [16]byte
	FlowLabel           uint32 // 20 bits
	PacketRate          uint8  // 6 bits
	TrafficClass        uint8
	HopLimit            uint8
	SL                  uint8 // 4 bits
	SubnetLocal         bool
	LocalACKTimeout     uint8 // 5 bits
}

// put writes the path's 44 bytes at d[0:44].
func (p *Path) put(d []byte) {
	binary.BigEndian.PutUint16(d[0:], p.LocalLID)
	binary.BigEndian.PutUint16(d[2:], p.RemoteLID)
	copy(d[4:20], p.LocalGID[:])
	copy(d[20:36], p.RemoteGID[:])
	binary.BigEndian.PutUint32(d[36:], p.FlowLabel&0xFFFFF<<12)
	setBits(&d[39], 2, 6, p.PacketRate)
	d[40], d[41] = p.TrafficClass, p.HopLimit
	setBits(&d[42], 0, 4, p.SL)
	setBits(&d[42], 4, 1, b2u(p.SubnetLocal))
	setBits(&d[43], 0, 5, p.LocalACKTimeout)
}

func (p *Path) get(d []byte) {
	p.LocalLID = binary.BigEndian.Uint16(d[0:])
	p.RemoteLID = binary.BigEndian.Uint16(d[2:])
	copy(p.LocalGID[:], d[4:20])
	copy(p.RemoteGID[:], d[20:36])
	p.FlowLabel = binary.BigEndian.Uint32(d[36:]) >> 12
	p.PacketRate = bits(d[39], 2, 6)
	p.TrafficClass, p.HopLimit = d[40], d[41]
	p.SL = bits(d[42], 0, 4)
	p.SubnetLocal = bits(d[42], 4, 1) != 0
	p.LocalACKTimeout = bits(d[43], 0, 5)
}

func b2u(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// REQ is ConnectRequest (IBTA Table 106).
type REQ struct {
	LocalCommID             uint32
	ServiceID               uint64
	LocalCAGUID             uint64
	LocalQKey               uint32
	LocalQPN                uint32 // 24 bits
	ResponderResources      uint8
	LocalEECN               uint32 // 24 bits
	InitiatorDepth          uint8
	RemoteEECN              uint32 // 24 bits
	RemoteCMResponseTimeout uint8  // 5 bits: 4.096 µs × 2^t
	TransportType           uint8  // 2 bits (TransportRC, TransportUC; 3: see ExtendedTransportType)
	EndToEndFlowControl     bool
	StartingPSN             uint32 // 24 bits
	LocalCMResponseTimeout  uint8  // 5 bits
	RetryCount              uint8  // 3 bits
	PKey                    uint16
	PathMTU                 uint8 // 4 bits (1 = 256 ... 5 = 4096)
	RDCExists               bool
	RNRRetryCount           uint8 // 3 bits
	MaxCMRetries            uint8 // 4 bits
	SRQ                     bool
	ExtendedTransportType   uint8 // 3 bits
	Primary, Alternate      Path
	PrivateData             [REQPrivateLen]byte
}

// Attr returns AttrREQ.
func (*REQ) Attr() AttrID { return AttrREQ }

func (m *REQ) put(d []byte) {
	binary.BigEndian.PutUint32(d[0:], m.LocalCommID)
	binary.BigEndian.PutUint64(d[8:], m.ServiceID)
	binary.BigEndian.PutUint64(d[16:], m.LocalCAGUID)
	binary.BigEndian.PutUint32(d[28:], m.LocalQKey)
	put24(d, 32, m.LocalQPN)
	d[35] = m.ResponderResources
	put24(d, 36, m.LocalEECN)
	d[39] = m.InitiatorDepth
	put24(d, 40, m.RemoteEECN)
	setBits(&d[43], 0, 5, m.RemoteCMResponseTimeout)
	setBits(&d[43], 5, 2, m.TransportType)
	setBits(&d[43], 7, 1, b2u(m.EndToEndFlowControl))
	put24(d, 44, m.StartingPSN)
	setBits(&d[47], 0, 5, m.LocalCMResponseTimeout)
	setBits(&d[47], 5, 3, m.RetryCount)
	binary.BigEndian.PutUint16(d[48:], m.PKey)
	setBits(&d[50], 0, 4, m.PathMTU)
	setBits(&d[50], 4, 1, b2u(m.RDCExists))
	setBits(&d[50], 5, 3, m.RNRRetryCount)
	setBits(&d[51], 0, 4, m.MaxCMRetries)
	setBits(&d[51], 4, 1, b2u(m.SRQ))
	setBits(&d[51], 5, 3, m.ExtendedTransportType)
	m.Primary.put(d[52:96])
	m.Alternate.put(d[96:140])
	copy(d[140:140+REQPrivateLen], m.PrivateData[:])
}

func (m *REQ) get(d []byte) error {
	m.LocalCommID = binary.BigEndian.Uint32(d[0:])
	m.ServiceID = binary.BigEndian.Uint64(d[8:])
	m.LocalCAGUID = binary.BigEndian.Uint64(d[16:])
	m.LocalQKey = binary.BigEndian.Uint32(d[28:])
	m.LocalQPN = get24(d, 32)
	m.ResponderResources = d[35]
	m.LocalEECN = get24(d, 36)
	m.InitiatorDepth = d[39]
	m.RemoteEECN = get24(d, 40)
	m.RemoteCMResponseTimeout = bits(d[43], 0, 5)
	m.TransportType = bits(d[43], 5, 2)
	m.EndToEndFlowControl = bits(d[43], 7, 1) != 0
	m.StartingPSN = get24(d, 44)
	m.LocalCMResponseTimeout = bits(d[47], 0, 5)
	m.RetryCount = bits(d[47], 5, 3)
	m.PKey = binary.BigEndian.Uint16(d[48:])
	m.PathMTU = bits(d[50], 0, 4)
	m.RDCExists = bits(d[50], 4, 1) != 0
	m.RNRRetryCount = bits(d[50], 5, 3)
	m.MaxCMRetries = bits(d[51], 0, 4)
	m.SRQ = bits(d[51], 4, 1) != 0
	m.ExtendedTransportType = bits(d[51], 5, 3)
	m.Primary.get(d[52:96])
	m.Alternate.get(d[96:140])
	copy(m.PrivateData[:], d[140:140+REQPrivateLen])
	return nil
}

// Which message an MRA or REJ refers to (MessageMRAed, MessageRejected).
const (
	MsgREQ   = 0
	MsgREP   = 1
	MsgOther = 2
)

// MRA is MsgRcptAck (IBTA Table 107): the receiver needs more time to answer.
type MRA struct {
	LocalCommID, RemoteCommID uint32
	MessageMRAed              uint8 // 2 bits: MsgREQ, MsgREP or MsgOther (LAP)
	ServiceTimeout            uint8 // 5 bits: 4.096 µs × 2^t
	PrivateData               [MRAPrivateLen]byte
}

// Attr returns AttrMRA.
func (*MRA) Attr() AttrID { return AttrMRA }

func (m *MRA) put(d []byte) {
	putIDs(d, m.LocalCommID, m.RemoteCommID)
	setBits(&d[8], 0, 2, m.MessageMRAed)
	setBits(&d[9], 0, 5, m.ServiceTimeout)
	copy(d[10:10+MRAPrivateLen], m.PrivateData[:])
}

func (m *MRA) get(d []byte) error {
	m.LocalCommID, m.RemoteCommID = getIDs(d)
	m.MessageMRAed = bits(d[8], 0, 2)
	m.ServiceTimeout = bits(d[9], 0, 5)
	copy(m.PrivateData[:], d[10:10+MRAPrivateLen])
	return nil
}

// Reject reasons (IBTA Table 109), those softrnic sends or acts on.
const (
	RejNoQP                  = 1
	RejNoResources           = 3
	RejTimeout               = 4
	RejUnsupported           = 5
	RejInvalidCommID         = 6
	RejInvalidServiceID      = 8
	RejInvalidTransportType  = 9
	RejStaleConn             = 10
	RejInvalidMTU            = 26
	RejInsufficientResources = 27 // insufficient responder resources
	RejConsumerReject        = 28
	RejDuplicateLocalCommID  = 30
)

// REJ is ConnectReject (IBTA Table 108).
type REJ struct {
	LocalCommID, RemoteCommID uint32
	MessageRejected           uint8 // 2 bits: MsgREQ, MsgREP or MsgOther
	InfoLength                uint8 // 7 bits: bytes of Info used (at most REJInfoLen)
	Reason                    uint16
	Info                      [REJInfoLen]byte // additional rejection information (ARI)
	PrivateData               [REJPrivateLen]byte
}

// Attr returns AttrREJ.
func (*REJ) Attr() AttrID { return AttrREJ }

func (m *REJ) put(d []byte) {
	putIDs(d, m.LocalCommID, m.RemoteCommID)
	setBits(&d[8], 0, 2, m.MessageRejected)
	setBits(&d[9], 0, 7, m.InfoLength)
	binary.BigEndian.PutUint16(d[10:], m.Reason)
	copy(d[12:12+REJInfoLen], m.Info[:])
	copy(d[84:84+REJPrivateLen], m.PrivateData[:])
}

func (m *REJ) get(d []byte) error {
	m.LocalCommID, m.RemoteCommID = getIDs(d)
	m.MessageRejected = bits(d[8], 0, 2)
	m.InfoLength = bits(d[9], 0, 7)
	m.Reason = binary.BigEndian.Uint16(d[10:])
	copy(m.Info[:], d[12:12+REJInfoLen])
	copy(m.PrivateData[:], d[84:84+REJPrivateLen])
	if m.InfoLength > REJInfoLen {
		return ErrField
	}
	return nil
}

// REP is ConnectReply (IBTA Table 110).
type REP struct {
	LocalCommID, RemoteCommID uint32
	LocalQKey                 uint32
	LocalQPN                  uint32 // 24 bits
	LocalEECN                 uint32 // 24 bits
	StartingPSN               uint32 // 24 bits
	ResponderResources        uint8
	InitiatorDepth            uint8
	TargetACKDelay            uint8 // 5 bits
	FailoverAccepted          uint8 // 2 bits
	EndToEndFlowControl       bool
	RNRRetryCount             uint8 // 3 bits
	SRQ                       bool
	LocalCAGUID               uint64
	PrivateData               [REPPrivateLen]byte
}

// Attr returns AttrREP.
func (*REP) Attr() AttrID { return AttrREP }

func (m *REP) put(d []byte) {
	putIDs(d, m.LocalCommID, m.RemoteCommID)
	binary.BigEndian.PutUint32(d[8:], m.LocalQKey)
	put24(d, 12, m.LocalQPN)
	put24(d, 16, m.LocalEECN)
	put24(d, 20, m.StartingPSN)
	d[24], d[25] = m.ResponderResources, m.InitiatorDepth
	setBits(&d[26], 0, 5, m.TargetACKDelay)
	setBits(&d[26], 5, 2, m.FailoverAccepted)
	setBits(&d[26], 7, 1, b2u(m.EndToEndFlowControl))
	setBits(&d[27], 0, 3, m.RNRRetryCount)
	setBits(&d[27], 3, 1, b2u(m.SRQ))
	binary.BigEndian.PutUint64(d[28:], m.LocalCAGUID)
	copy(d[36:36+REPPrivateLen], m.PrivateData[:])
}

func (m *REP) get(d []byte) error {
	m.LocalCommID, m.RemoteCommID = getIDs(d)
	m.LocalQKey = binary.BigEndian.Uint32(d[8:])
	m.LocalQPN = get24(d, 12)
	m.LocalEECN = get24(d, 16)
	m.StartingPSN = get24(d, 20)
	m.ResponderResources, m.InitiatorDepth = d[24], d[25]
	m.TargetACKDelay = bits(d[26], 0, 5)
	m.FailoverAccepted = bits(d[26], 5, 2)
	m.EndToEndFlowControl = bits(d[26], 7, 1) != 0
	m.RNRRetryCount = bits(d[27], 0, 3)
	m.SRQ = bits(d[27], 3, 1) != 0
	m.LocalCAGUID = binary.BigEndian.Uint64(d[28:])
	copy(m.PrivateData[:], d[36:36+REPPrivateLen])
	return nil
}

// RTU is ReadyToUse (IBTA Table 111).
type RTU struct {
	LocalCommID, RemoteCommID uint32
	PrivateData               [RTUPrivateLen]byte
}

// Attr returns AttrRTU.
func (*RTU) Attr() AttrID { return AttrRTU }

func (m *RTU) put(d []byte) {
	putIDs(d, m.LocalCommID, m.RemoteCommID)
	copy(d[8:8+RTUPrivateLen], m.PrivateData[:])
}

func (m *RTU) get(d []byte) error {
	m.LocalCommID, m.RemoteCommID = getIDs(d)
	copy(m.PrivateData[:], d[8:8+RTUPrivateLen])
	return nil
}

// DREQ is DisconnectRequest (IBTA Table 112).
type DREQ struct {
	LocalCommID, RemoteCommID uint32
	RemoteQPN                 uint32 // 24 bits: the QP (or EEC) of the receiver to disconnect
	PrivateData               [DREQPrivateLen]byte
}

// Attr returns AttrDREQ.
func (*DREQ) Attr() AttrID { return AttrDREQ }

func (m *DREQ) put(d []byte) {
	putIDs(d, m.LocalCommID, m.RemoteCommID)
	put24(d, 8, m.RemoteQPN)
	copy(d[12:12+DREQPrivateLen], m.PrivateData[:])
}

func (m *DREQ) get(d []byte) error {
	m.LocalCommID, m.RemoteCommID = getIDs(d)
	m.RemoteQPN = get24(d, 8)
	copy(m.PrivateData[:], d[12:12+DREQPrivateLen])
	return nil
}

// DREP is DisconnectReply (IBTA Table 113).
type DREP struct {
	LocalCommID, RemoteCommID uint32
	PrivateData               [DREPPrivateLen]byte
}

// Attr returns AttrDREP.
func (*DREP) Attr() AttrID { return AttrDREP }

func (m *DREP) put(d []byte) {
	putIDs(d, m.LocalCommID, m.RemoteCommID)
	copy(d[8:8+DREPPrivateLen], m.PrivateData[:])
}

func (m *DREP) get(d []byte) error {
	m.LocalCommID, m.RemoteCommID = getIDs(d)
	copy(m.PrivateData[:], d[8:8+DREPPrivateLen])
	return nil
}

// putIDs writes the local and remote communication IDs every message but REQ starts with.
func putIDs(d []byte, local, remote uint32) {
	binary.BigEndian.PutUint32(d[0:], local)
	binary.BigEndian.PutUint32(d[4:], remote)
}

func getIDs(d []byte) (local, remote uint32) {
	return binary.BigEndian.Uint32(d[0:]), binary.BigEndian.Uint32(d[4:])
}

package transport

import "fmt"

// QPState is a queue pair state, with libibverbs' values.
type QPState uint8

// QP states.
const (
	StateReset QPState = iota
	StateInit
	StateRTR
	StateRTS
	StateSQD
	StateSQE
	StateErr
)

var stateNames = [...]string{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"}

func (s QPState) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "UNKNOWN"
}

// Send work request opcodes (ibv_wr_opcode values).
const (
	WRWrite         uint8 = 0
	WRWriteImm      uint8 = 1
	WRSend          uint8 = 2
	WRSendImm       uint8 = 3
	WRRead          uint8 = 4
	WRAtomicCmpSwap uint8 = 5
	WRAtomicFetch   uint8 = 6
)

var wrOpNames = [...]string{
	WRWrite: "RDMA_WRITE", WRWriteImm: "RDMA_WRITE_WITH_IMM", WRSend: "SEND", WRSendImm: "SEND_WITH_IMM",
	WRRead: "RDMA_READ", WRAtomicCmpSwap: "ATOMIC_CMP_AND_SWP", WRAtomicFetch: "ATOMIC_FETCH_AND_ADD",
}

// WROpName returns a send opcode's name as libibverbs spells it without IBV_WR_, e.g.
// "RDMA_WRITE", or "opcode N" for a number that is none.
func WROpName(op uint8) string {
	if int(op) < len(wrOpNames) {
		return wrOpNames[op]
	}
	return fmt.Sprintf("opcode %d", op)
}

// Send flags (ibv_send_flags values).
const (
	FlagFence     uint8 = 1
	FlagSignaled  uint8 = 2
	FlagSolicited uint8 = 4
	FlagInline    uint8 = 8
)

// Work completion status (ibv_wc_status values).
const (
	StatusSuccess        uint8 = 0
	StatusLocLenErr      uint8 = 1
	StatusLocQPOpErr     uint8 = 2
	StatusLocProtErr     uint8 = 4
	StatusWRFlushErr     uint8 = 5
	StatusBadRespErr     uint8 = 7
	StatusLocAccessErr   uint8 = 8
	StatusRemInvReqErr   uint8 = 9
	StatusRemAccessErr   uint8 = 10
	StatusRemOpErr       uint8 = 11
	StatusRetryExcErr    uint8 = 12
	StatusRNRRetryExcErr uint8 = 13
	StatusFatalErr       uint8 = 19
	StatusGeneralErr     uint8 = 21
)

// Work completion opcodes (ibv_wc_opcode values).
const (
	WCSend        uint8 = 0
	WCWrite       uint8 = 1
	WCRead        uint8 = 2
	WCCompSwap    uint8 = 3
	WCFetchAdd    uint8 = 4
	WCRecv        uint8 = 128
	WCRecvRDMAImm uint8 = 129
)

// Work completion flags (ibv_wc_flags values).
const (
	WCFlagGRH     uint8 = 1 // the receive buffer starts with the 40-byte GRH area (UD)
	WCFlagWithImm uint8 = 2
)

// Vendor error codes carried in CQE.VendorErr to say more than the status does.
const (
	VendorNone        uint32 = 0
	VendorBadLKey     uint32 = 0x10 // local key unknown
	VendorBadPD       uint32 = 0x11 // local region in another protection domain
	VendorNoRights    uint32 = 0x12 // local region lacks the access right
	VendorBounds      uint32 = 0x13 // local access outside the region
	VendorRevoked     uint32 = 0x14 // the region was deregistered while a message used it
	VendorRemoteNAK   uint32 = 0x20 // the peer answered with a NAK (low bits: NAK code)
	VendorRetryTimer  uint32 = 0x30 // local ACK timeout retries exhausted
	VendorRNRTimer    uint32 = 0x31 // RNR retries exhausted
	VendorCQOverflow  uint32 = 0x40 // a completion was lost to a full CQ
	VendorOpcodeOrder uint32 = 0x50 // the peer broke the opcode sequence
	VendorLength      uint32 = 0x51 // a message did not fit its receive buffer
	VendorRespOrder   uint32 = 0x52 // a response did not match the request
)

// CQE is one completion queue entry.
type CQE struct {
	WRID      uint64
	QPN       uint32
	SrcQP     uint32
	ByteLen   uint32
	Imm       uint32
	VendorErr uint32
	Status    uint8
	Opcode    uint8
	Flags     uint8
	SrcPort   uint16 // UD: the datagram's UDP source port
	solicited bool
	srq       bool // a receive completion of a QP on an SRQ (counted when polled)
}

// SGE is one element of a scatter/gather list.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// SendWR is a send work request as the transport takes it.
type SendWR struct {
	WRID       uint64
	SG         []SGE
	Opcode     uint8
	Flags      uint8
	Imm        uint32
	RemoteAddr uint64
	RKey       uint32
	CompareAdd uint64
	Swap       uint64
	// UD: where the datagram goes (address handle, QP number) and the Q_Key it carries
	// (one with the high bit set means the QP's own Q_Key).
	AH         *AH
	RemoteQPN  uint32
	RemoteQKey uint32
}

// RecvWR is a receive work request.
type RecvWR struct {
	WRID uint64
	SG   []SGE
}

// EventType is an asynchronous event (ibv_event_type values).
type EventType uint8

// Asynchronous events.
const (
	EventCQErr          EventType = 0
	EventQPFatal        EventType = 1
	EventQPReqErr       EventType = 2
	EventQPAccessErr    EventType = 3
	EventCommEst        EventType = 4
	EventSQDrained      EventType = 5
	EventPathMig        EventType = 6
	EventPathMigErr     EventType = 7
	EventDeviceFatal    EventType = 8
	EventPortActive     EventType = 9
	EventPortErr        EventType = 10
	EventLIDChange      EventType = 11
	EventPKeyChange     EventType = 12
	EventSMChange       EventType = 13
	EventSRQErr         EventType = 14
	EventSRQLimit       EventType = 15
	EventQPLastWQE      EventType = 16
	EventClientReregist EventType = 17
	EventGIDChange      EventType = 18
)

// Event is an asynchronous event raised by the engine.
type Event struct {
	Type EventType
	QP   *QP
	CQ   *CQ
	SRQ  *RecvQueue
	// Detail says in words what happened (for logs and errors).
	Detail string
}

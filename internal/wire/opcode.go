// Package wire encodes and decodes RoCEv2 packets: the InfiniBand Base Transport Header
// (BTH), the extended transport headers an opcode requires (DETH, RETH, AETH, ImmDt, IETH,
// AtomicETH, AtomicAckETH), padding, and the invariant CRC (ICRC) computed over the
// masked IP/UDP pseudo-header as RoCEv2 defines it.
//
// Decoding never panics on malformed input: every decoder checks lengths and returns an
// error. Nothing here allocates on the hot path.
package wire

// Opcode is the 8-bit BTH opcode: the upper three bits are the transport (000 = RC), the
// lower five the operation.
type Opcode uint8

// Reliable-connected opcodes (IBTA Vol. 1, table 38).
const (
	OpSendFirst          Opcode = 0x00
	OpSendMiddle         Opcode = 0x01
	OpSendLast           Opcode = 0x02
	OpSendLastImm        Opcode = 0x03
	OpSendOnly           Opcode = 0x04
	OpSendOnlyImm        Opcode = 0x05
	OpWriteFirst         Opcode = 0x06
	OpWriteMiddle        Opcode = 0x07
	OpWriteLast          Opcode = 0x08
	OpWriteLastImm       Opcode = 0x09
	OpWriteOnly          Opcode = 0x0A
	OpWriteOnlyImm       Opcode = 0x0B
	OpReadRequest        Opcode = 0x0C
	OpReadResponseFirst  Opcode = 0x0D
	OpReadResponseMiddle Opcode = 0x0E
	OpReadResponseLast   Opcode = 0x0F
	OpReadResponseOnly   Opcode = 0x10
	OpAcknowledge        Opcode = 0x11
	OpAtomicAcknowledge  Opcode = 0x12
	OpCompareSwap        Opcode = 0x13
	OpFetchAdd           Opcode = 0x14
	OpSendLastInvalidate Opcode = 0x16
	OpSendOnlyInvalidate Opcode = 0x17

	opcodeCount                  = 256
	transportUD           Opcode = 0x60
	transportMask         Opcode = 0xE0
	transportManufacturer Opcode = 0xC0 // 0xC0..0xFF: manufacturer-specific
)

// Unreliable-datagram opcodes (IBTA Vol. 1, table 38): a UD message is one packet.
const (
	OpUDSendOnly    Opcode = 0x64
	OpUDSendOnlyImm Opcode = 0x65
)

// Extended headers an opcode may carry, in wire order, and what kind of packet it is.
const (
	HasRETH uint32 = 1 << iota
	HasAETH
	HasAtomicETH
	HasAtomicAckETH
	HasImmDt
	HasIETH
	HasPayload
	IsFirst
	IsMiddle
	IsLast
	IsRequest
	IsResponse
	IsSend
	IsWrite
	IsRead
	IsAtomic
	IsWeak // a weakly-ordered mode packet (manufacturer-specific)
	HasDETH
	IsUD // an unreliable-datagram packet
)

// OpInfo describes one opcode: which headers follow the BTH and what kind of packet it is.
type OpInfo struct {
	Name   string
	Flags  uint32
	HdrLen int // BTH plus all extended headers
	Valid  bool
}

// Has reports whether all of the given flag bits are set for the opcode.
func (i *OpInfo) Has(f uint32) bool { return i.Flags&f == f }

var opTable [opcodeCount]OpInfo

// Header sizes in bytes.
const (
	BTHLen          = 12
	RETHLen         = 16
	AETHLen         = 4
	ImmDtLen        = 4
	IETHLen         = 4
	AtomicETHLen    = 28
	AtomicAckETHLen = 8
	DETHLen         = 8
	ICRCLen         = 4
	// MaxHeaderLen bounds BTH plus extended headers of any standard opcode.
	MaxHeaderLen = BTHLen + AtomicETHLen + ImmDtLen + RETHLen
)

func hdrLen(flags uint32) int {
	n := BTHLen
	if flags&HasDETH != 0 {
		n += DETHLen
	}
	if flags&HasRETH != 0 {
		n += RETHLen
	}
	if flags&HasAETH != 0 {
		n += AETHLen
	}
	if flags&HasAtomicETH != 0 {
		n += AtomicETHLen
	}
	if flags&HasAtomicAckETH != 0 {
		n += AtomicAckETHLen
	}
	if flags&HasImmDt != 0 {
		n += ImmDtLen
	}
	if flags&HasIETH != 0 {
		n += IETHLen
	}
	return n
}

// RegisterOpcode adds a manufacturer-specific opcode (0xC0..0xFF) with the given header
// layout. The standard RC opcodes are registered at init; it panics on a standard opcode
// or a duplicate, which is a programming error.
func RegisterOpcode(op Opcode, name string, flags uint32, extra int) {
	if op&transportMask != transportManufacturer {
		panic("wire: RegisterOpcode outside the manufacturer-specific range: " + name)
	}
	if opTable[op].Valid {
		panic("wire: opcode registered twice: " + name)
	}
	opTable[op] = OpInfo{Name: name, Flags: flags, HdrLen: hdrLen(flags) + extra, Valid: true}
}

func init() {
	def := func(op Opcode, name string, flags uint32) {
		opTable[op] = OpInfo{Name: name, Flags: flags, HdrLen: hdrLen(flags), Valid: true}
	}
	const sendReq = IsRequest | IsSend | HasPayload
	const writeReq = IsRequest | IsWrite | HasPayload
	const readResp = IsResponse | IsRead | HasPayload
	def(OpSendFirst, "SEND_FIRST", sendReq|IsFirst)
	def(OpSendMiddle, "SEND_MIDDLE", sendReq|IsMiddle)
	def(OpSendLast, "SEND_LAST", sendReq|IsLast)
	def(OpSendLastImm, "SEND_LAST_WITH_IMMEDIATE", sendReq|IsLast|HasImmDt)
	def(OpSendOnly, "SEND_ONLY", sendReq|IsFirst|IsLast)
	def(OpSendOnlyImm, "SEND_ONLY_WITH_IMMEDIATE", sendReq|IsFirst|IsLast|HasImmDt)
	def(OpWriteFirst, "RDMA_WRITE_FIRST", writeReq|IsFirst|HasRETH)
	def(OpWriteMiddle, "RDMA_WRITE_MIDDLE", writeReq|IsMiddle)
	def(OpWriteLast, "RDMA_WRITE_LAST", writeReq|IsLast)
	def(OpWriteLastImm, "RDMA_WRITE_LAST_WITH_IMMEDIATE", writeReq|IsLast|HasImmDt)
	def(OpWriteOnly, "RDMA_WRITE_ONLY", writeReq|IsFirst|IsLast|HasRETH)
	def(OpWriteOnlyImm, "RDMA_WRITE_ONLY_WITH_IMMEDIATE", writeReq|IsFirst|IsLast|HasRETH|HasImmDt)
	def(OpReadRequest, "RDMA_READ_REQUEST", IsRequest|IsRead|IsFirst|IsLast|HasRETH)
	def(OpReadResponseFirst, "RDMA_READ_RESPONSE_FIRST", readResp|IsFirst|HasAETH)
	def(OpReadResponseMiddle, "RDMA_READ_RESPONSE_MIDDLE", readResp|IsMiddle)
	def(OpReadResponseLast, "RDMA_READ_RESPONSE_LAST", readResp|IsLast|HasAETH)
	def(OpReadResponseOnly, "RDMA_READ_RESPONSE_ONLY", readResp|IsFirst|IsLast|HasAETH)
	def(OpAcknowledge, "ACKNOWLEDGE", IsResponse|IsFirst|IsLast|HasAETH)
	def(OpAtomicAcknowledge, "ATOMIC_ACKNOWLEDGE", IsResponse|IsAtomic|IsFirst|IsLast|HasAETH|HasAtomicAckETH)
	def(OpCompareSwap, "COMPARE_SWAP", IsRequest|IsAtomic|IsFirst|IsLast|HasAtomicETH)
	def(OpFetchAdd, "FETCH_ADD", IsRequest|IsAtomic|IsFirst|IsLast|HasAtomicETH)
	def(OpSendLastInvalidate, "SEND_LAST_WITH_INVALIDATE", sendReq|IsLast|HasIETH)
	def(OpSendOnlyInvalidate, "SEND_ONLY_WITH_INVALIDATE", sendReq|IsFirst|IsLast|HasIETH)
	const udSend = IsUD | IsRequest | IsSend | HasPayload | IsFirst | IsLast | HasDETH
	def(OpUDSendOnly, "UD_SEND_ONLY", udSend)
	def(OpUDSendOnlyImm, "UD_SEND_ONLY_WITH_IMMEDIATE", udSend|HasImmDt)
}

// Info returns the description of op; Valid is false for opcodes this stack does not know.
func (op Opcode) Info() *OpInfo { return &opTable[op] }

// String returns the IBTA name of the opcode.
func (op Opcode) String() string {
	if i := &opTable[op]; i.Valid {
		return i.Name
	}
	return "UNKNOWN_OPCODE"
}

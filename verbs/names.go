package verbs

import (
	"fmt"
	"strings"

	"github.com/softrnic/softrnic/internal/transport"
)

// The String methods of the package's enums and flag sets: every value prints its name
// (libibverbs' enum name without the IBV_ prefix, or a flag set as NAME|NAME), and a value
// outside the enum prints as Type(number), so that an error never shows a bare number.

// String returns the opcode's name, e.g. "RDMA_WRITE" (IBV_WR_RDMA_WRITE).
func (o WROpcode) String() string {
	if o >= WRRDMAWrite && o <= WRAtomicFetchAndAdd {
		return transport.WROpName(uint8(o))
	}
	return fmt.Sprintf("WROpcode(%d)", int(o))
}

// String returns the MTU's size in bytes, e.g. "1024" (IBV_MTU_1024).
func (m MTU) String() string {
	if n := m.Bytes(); n > 0 {
		return fmt.Sprint(n)
	}
	return fmt.Sprintf("MTU(%d)", int(m))
}

// String returns the capability's name, e.g. "ATOMIC_HCA".
func (a AtomicCap) String() string {
	switch a {
	case AtomicNone:
		return "ATOMIC_NONE"
	case AtomicHCA:
		return "ATOMIC_HCA"
	case AtomicGlob:
		return "ATOMIC_GLOB"
	}
	return fmt.Sprintf("AtomicCap(%d)", int(a))
}

// String returns the action's name, "RNR" or "DROP".
func (h HardAction) String() string {
	switch h {
	case HardRNR:
		return "RNR"
	case HardDrop:
		return "DROP"
	}
	return fmt.Sprintf("HardAction(%d)", int(h))
}

// flagName names one bit of a flag set.
type flagName struct {
	bit  uint64
	name string
}

// flagString formats the set bits of v by name, joined by "|", with the bits it has no
// name for in hex; "0" when none is set.
func flagString(v uint64, names []flagName) string {
	if v == 0 {
		return "0"
	}
	var b strings.Builder
	for _, f := range names {
		if v&f.bit != 0 {
			if b.Len() > 0 {
				b.WriteByte('|')
			}
			b.WriteString(f.name)
			v &^= f.bit
		}
	}
	if v != 0 {
		if b.Len() > 0 {
			b.WriteByte('|')
		}
		fmt.Fprintf(&b, "%#x", v)
	}
	return b.String()
}

var accessNames = []flagName{
	{uint64(AccessLocalWrite), "LOCAL_WRITE"}, {uint64(AccessRemoteWrite), "REMOTE_WRITE"},
	{uint64(AccessRemoteRead), "REMOTE_READ"}, {uint64(AccessRemoteAtomic), "REMOTE_ATOMIC"},
	{uint64(AccessOnDemand), "ON_DEMAND"},
}

// String names the rights, e.g. "LOCAL_WRITE|REMOTE_READ" (IBV_ACCESS_...); "0" for none.
func (a AccessFlags) String() string { return flagString(uint64(a), accessNames) }

var sendFlagNames = []flagName{
	{uint64(SendFence), "FENCE"}, {uint64(SendSignaled), "SIGNALED"},
	{uint64(SendSolicited), "SOLICITED"}, {uint64(SendInline), "INLINE"},
}

// String names the flags, e.g. "SIGNALED|INLINE" (IBV_SEND_...); "0" for none.
func (f SendFlags) String() string { return flagString(uint64(f), sendFlagNames) }

var wcFlagNames = []flagName{{uint64(WCGRH), "GRH"}, {uint64(WCWithImm), "WITH_IMM"}}

// String names the flags, e.g. "WITH_IMM" (IBV_WC_...); "0" for none.
func (f WCFlags) String() string { return flagString(uint64(f), wcFlagNames) }

var cqAttrNames = []flagName{{uint64(CQAttrHandler), "HANDLER"}, {uint64(CQAttrModeration), "MODERATION"}}

// String names the mask's bits, e.g. "HANDLER|MODERATION"; "0" for none.
func (m CQAttrMask) String() string { return flagString(uint64(m), cqAttrNames) }

var srqAttrNames = []flagName{{uint64(SRQAttrMaxWR), "MAX_WR"}, {uint64(SRQAttrLimit), "LIMIT"}}

// String names the mask's bits, e.g. "MAX_WR|LIMIT" (IBV_SRQ_...); "0" for none.
func (m SRQAttrMask) String() string { return flagString(uint64(m), srqAttrNames) }

var zeroFieldNames = []flagName{
	{uint64(ZeroTimeout), "Timeout"}, {uint64(ZeroRetryCnt), "RetryCnt"}, {uint64(ZeroRNRRetry), "RNRRetry"},
	{uint64(ZeroMinRNRTimer), "MinRNRTimer"}, {uint64(ZeroMaxRdAtomic), "MaxRdAtomic"},
}

// String names the ConnectOptions fields in the set, e.g. "Timeout|RetryCnt"; "0" for none.
func (z ZeroFields) String() string { return flagString(uint64(z), zeroFieldNames) }

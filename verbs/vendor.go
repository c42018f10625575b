package verbs

import (
	"fmt"

	"github.com/softrnic/softrnic/internal/transport"
)

// VendorErr is the vendor error of a failed work completion (ibv_wc.vendor_err): what the
// status does not say. Print it with %v for its meaning.
type VendorErr uint32

// Vendor errors.
const (
	VendorNone VendorErr = VendorErr(transport.VendorNone)
	// A scatter/gather element's local key was unknown (or deregistered), belonged to
	// another protection domain, lacked the access right, or the access lay outside the
	// region.
	VendorBadLKey  VendorErr = VendorErr(transport.VendorBadLKey)
	VendorBadPD    VendorErr = VendorErr(transport.VendorBadPD)
	VendorNoRights VendorErr = VendorErr(transport.VendorNoRights)
	VendorBounds   VendorErr = VendorErr(transport.VendorBounds)
	// VendorRevoked: the memory region was deregistered while a message was using it.
	VendorRevoked VendorErr = VendorErr(transport.VendorRevoked)
	// VendorRemoteNAK is the peer's NAK; the low bits hold the NAK code (VendorErr.NAKCode).
	VendorRemoteNAK VendorErr = VendorErr(transport.VendorRemoteNAK)
	// VendorRetryTimer: the local ACK timeout fired retry_cnt+1 times.
	VendorRetryTimer VendorErr = VendorErr(transport.VendorRetryTimer)
	// VendorUnreachable: the peer's host answered the QP's requests with ICMP port
	// unreachable (no device runs at the peer's address and port), and the QP failed at
	// once with RETRY_EXC_ERR, the status its retries would have ended with (Linux only;
	// elsewhere the retries run out: VendorRetryTimer).
	VendorUnreachable VendorErr = VendorErr(transport.VendorUnreachable)
	// VendorRNRTimer: the peer answered with an RNR NAK rnr_retry+1 times.
	VendorRNRTimer VendorErr = VendorErr(transport.VendorRNRTimer)
	// VendorCQOverflow: a completion was lost to a full CQ.
	VendorCQOverflow VendorErr = VendorErr(transport.VendorCQOverflow)
	// VendorOpcodeOrder: the peer broke the opcode sequence or sent an opcode the QP
	// does not support.
	VendorOpcodeOrder VendorErr = VendorErr(transport.VendorOpcodeOrder)
	// VendorLength: a message did not fit its receive buffer, or its length was invalid.
	VendorLength VendorErr = VendorErr(transport.VendorLength)
	// VendorRespOrder: a response did not match its request.
	VendorRespOrder VendorErr = VendorErr(transport.VendorRespOrder)
)

var vendorText = map[VendorErr]string{
	VendorNone:        "none",
	VendorBadLKey:     "local key unknown or deregistered",
	VendorBadPD:       "local region in another protection domain",
	VendorNoRights:    "local region lacks the access right",
	VendorBounds:      "local access outside the region",
	VendorRevoked:     "memory region deregistered while the message used it",
	VendorRetryTimer:  "local ACK timeout: retries exhausted (peer unreachable, or its QP not connected to this one)",
	VendorUnreachable: "peer unreachable: its host reports the port closed (ICMP port unreachable)",
	VendorRNRTimer:    "RNR retries exhausted: the peer had no receive posted",
	VendorCQOverflow:  "completion lost to a full CQ",
	VendorOpcodeOrder: "peer broke the opcode sequence or used an unsupported opcode",
	VendorLength:      "message length invalid or larger than the receive buffer",
	VendorRespOrder:   "response did not match its request",
}

var nakText = [...]string{"PSN sequence error", "invalid request", "remote access error", "remote operational error", "invalid RD request"}

// NAKCode returns the peer's NAK code (IBTA: 0 PSN sequence error, 1 invalid request,
// 2 remote access error, 3 remote operational error) and true for VendorRemoteNAK errors.
func (v VendorErr) NAKCode() (uint8, bool) {
	if v < VendorRemoteNAK || v >= VendorRemoteNAK+0x10 {
		return 0, false
	}
	return uint8(v - VendorRemoteNAK), true
}

// String says what the vendor error means.
func (v VendorErr) String() string {
	if code, ok := v.NAKCode(); ok {
		if int(code) < len(nakText) {
			return "peer NAK: " + nakText[code]
		}
		return fmt.Sprintf("peer NAK code %d", code)
	}
	if s, ok := vendorText[v]; ok {
		return s
	}
	return fmt.Sprintf("vendor error %#x", uint32(v))
}

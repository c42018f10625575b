package cm

import (
	"errors"
	"fmt"

	"github.com/softrnic/softrnic/internal/mad"
)

// Errors a caller can act on; test with errors.Is.
var (
	// ErrRejected: the peer rejected the connection (the error is a *RejectError with
	// the reason and the peer's private data).
	ErrRejected = errors.New("cm: connection rejected")
	// ErrNoListener: nothing listens on the service port at the peer device (a
	// *RejectError with reason ReasonInvalidServiceID also matches it).
	ErrNoListener = errors.New("cm: no listener on the service port")
	// ErrTimeout: the peer did not answer within the CM response timeout, however many
	// times the message was resent.
	ErrTimeout = errors.New("cm: no answer from the peer")
	// ErrClosed: the listener, connection or device was closed. When the device was
	// closed the error matches verbs.ErrClosed too.
	ErrClosed = errors.New("cm: closed")
	// ErrDisconnected: the connection was ended by a DisconnectRequest, from this side
	// (Disconnect) or from the peer.
	ErrDisconnected = errors.New("cm: disconnected")
	// ErrPeerUnreachable: the peer device is not there. It stopped answering keep-alive
	// probes, or (Linux) its host answered with ICMP port unreachable: nothing is bound
	// to the device's UDP port there, as TCP's "connection refused" says. The report ends
	// a Dial at once (its first ConnectRequest's round trip), and every connection to the
	// device at its next keep-alive probe (see unreach.go).
	ErrPeerUnreachable = errors.New("cm: peer device unreachable")
	// ErrPeerRestarted: the peer device is gone and a new one answers at its address
	// (its process was killed and another opened a device on the same address and
	// port): the connections made with the old one ended.
	ErrPeerRestarted = errors.New("cm: peer device restarted")
	// ErrPrivateData: private data longer than the message carries.
	ErrPrivateData = errors.New("cm: private data too long")
	// ErrState: the call does not fit the request's or QP's state.
	ErrState = errors.New("cm: wrong state")
)

// RejectReason is the reason code of a ConnectReject (IBTA Table 109).
type RejectReason uint16

// Reject reasons softrnic sends or acts on.
const (
	ReasonNoQP                  RejectReason = mad.RejNoQP
	ReasonNoResources           RejectReason = mad.RejNoResources
	ReasonTimeout               RejectReason = mad.RejTimeout
	ReasonUnsupported           RejectReason = mad.RejUnsupported
	ReasonInvalidCommID         RejectReason = mad.RejInvalidCommID
	ReasonInvalidServiceID      RejectReason = mad.RejInvalidServiceID
	ReasonInvalidTransportType  RejectReason = mad.RejInvalidTransportType
	ReasonStaleConn             RejectReason = mad.RejStaleConn
	ReasonInvalidMTU            RejectReason = mad.RejInvalidMTU
	ReasonInsufficientResources RejectReason = mad.RejInsufficientResources
	ReasonConsumerReject        RejectReason = mad.RejConsumerReject
	ReasonDuplicateLocalCommID  RejectReason = mad.RejDuplicateLocalCommID
)

var reasonNames = map[RejectReason]string{
	ReasonNoQP: "no QP", ReasonNoResources: "no resources", ReasonTimeout: "timeout",
	ReasonUnsupported: "unsupported request", ReasonInvalidCommID: "invalid communication ID",
	ReasonInvalidServiceID: "invalid service ID (no listener)", ReasonInvalidTransportType: "invalid transport type",
	ReasonStaleConn: "stale connection", ReasonInvalidMTU: "invalid path MTU",
	ReasonInsufficientResources: "insufficient responder resources", ReasonConsumerReject: "consumer reject",
	ReasonDuplicateLocalCommID: "duplicate local communication ID",
}

func (r RejectReason) String() string {
	if n, ok := reasonNames[r]; ok {
		return n
	}
	return fmt.Sprintf("reason %d", uint16(r))
}

// RejectError is the error of a rejected connection: the reason, and the private data
// the rejecting side sent (the whole field, 148 bytes, zero-padded, as rdma_cm gives it).
type RejectError struct {
	Reason      RejectReason
	PrivateData []byte
}

func (e *RejectError) Error() string { return "cm: connection rejected: " + e.Reason.String() }

// Is makes errors.Is(err, ErrRejected) true for every reject, ErrNoListener for
// ReasonInvalidServiceID and ErrTimeout for ReasonTimeout.
func (e *RejectError) Is(target error) bool {
	switch target {
	case ErrRejected:
		return true
	case ErrNoListener:
		return e.Reason == ReasonInvalidServiceID
	case ErrTimeout:
		return e.Reason == ReasonTimeout
	}
	return false
}

package cm

import (
	"math/bits"

	"github.com/softrnic/softrnic/internal/mad"
	"time"

	"github.com/softrnic/softrnic/verbs"
)

// CM timeouts are 5-bit codes t meaning 4.096 µs × 2^t (IBTA 12.6).

// timeoutCode returns the smallest code whose time is at least d.
func timeoutCode(d time.Duration) uint8 {
	for t := uint8(0); t < 31; t++ {
		if codeDuration(t) >= d {
			return t
		}
	}
	return 31
}

func codeDuration(t uint8) time.Duration { return 4096 * time.Nanosecond << (t & 31) }

// Bounds on waits a peer's codes ask for, so that a hostile or odd peer cannot make a
// connection wait hours (code 31) or retry every 4 µs (code 0).
const (
	minWait = 10 * time.Millisecond
	maxWait = 60 * time.Second
)

func clampWait(d time.Duration) time.Duration { return min(max(d, minWait), maxWait) }

// The softrnic extension in the Local EECN field of REQ and REP (reserved for RC by
// IBTA): a mark, the weakly-ordered offer (REQ) or choice (REP), log2 of weak mode's
// largest hole, and (REP) the path MTU chosen.
const (
	extMark     = mad.SoftrnicEECNMark
	extWeak     = 1 << 22
	extMTUShift = 8
	extHoleMask = 0x1F
)

// ext encodes an offer or choice.
func ext(o verbs.Ordering, maxHole uint32, mtu verbs.MTU) uint32 {
	v := uint32(extMark) | uint32(mtu&0xF)<<extMTUShift
	if o == verbs.OrderingWeak {
		if maxHole == 0 {
			maxHole = verbs.DefaultMaxHole
		}
		v |= extWeak | uint32(bits.Len32(maxHole)-1)&extHoleMask
	}
	return v
}

// extInfo is a decoded extension; ok is false if the peer sent none (a standard CM).
type extInfo struct {
	ok      bool
	weak    bool
	maxHole uint32
	mtu     verbs.MTU
}

func parseExt(v uint32) extInfo {
	if v&extMark == 0 {
		return extInfo{}
	}
	e := extInfo{ok: true, mtu: verbs.MTU(v >> extMTUShift & 0xF)}
	if v&extWeak != 0 {
		// weak mode's spans are powers of two from 64 to 65536
		if s := v & extHoleMask; s >= 6 && s <= 16 {
			e.weak, e.maxHole = true, 1<<s
		}
	}
	return e
}

// validMTU reports whether m is a path MTU code (256 to 4096).
func validMTU(m verbs.MTU) bool { return m >= verbs.MTU256 && m <= verbs.MTU4096 }

// zeroes returns the Zero flags for the options whose value is 0 after negotiation.
func zeroes(o *verbs.ConnectOptions) {
	for _, f := range []struct {
		v uint8
		z verbs.ZeroFields
	}{{o.RetryCnt, verbs.ZeroRetryCnt}, {o.RNRRetry, verbs.ZeroRNRRetry}, {o.MaxRdAtomic, verbs.ZeroMaxRdAtomic}, {o.Timeout, verbs.ZeroTimeout}, {o.MinRNRTimer, verbs.ZeroMinRNRTimer}} {
		if f.v == 0 {
			o.Zero |= f.z
		}
	}
}

package wire

import "time"

// PSNMask keeps the 24 bits of a packet sequence number.
const PSNMask = 0xFFFFFF

// psnHalf is half the PSN space: a PSN less than this far ahead is "after".
const psnHalf = 1 << 23

// PSNAdd returns psn + n modulo 2^24.
func PSNAdd(psn, n uint32) uint32 { return (psn + n) & PSNMask }

// PSNDiff returns a - b as a signed distance in the 24-bit circular space, in
// [-2^23, 2^23).
func PSNDiff(a, b uint32) int32 {
	d := (a - b) & PSNMask
	if d >= psnHalf {
		return int32(d) - (1 << 24)
	}
	return int32(d)
}

// PSNBefore reports whether a comes strictly before b in circular order.
func PSNBefore(a, b uint32) bool { return PSNDiff(a, b) < 0 }

// AETH syndromes (IBTA 9.7.5.2): the top three bits select the kind.
const (
	AETHAck   = 0x00 // ACK; low 5 bits: credit count (0x1F = invalid / not used)
	AETHRNR   = 0x20 // RNR NAK; low 5 bits: minimal RNR NAK timer
	AETHNak   = 0x60 // NAK; low 5 bits: NAK code
	NoCredits = 0x1F // "invalid credit count": end-to-end credits are not used

	aethKind  = 0xE0
	aethValue = 0x1F
)

// NAK codes.
const (
	NakPSNSeqError       = 0
	NakInvalidRequest    = 1
	NakRemoteAccessError = 2
	NakRemoteOpError     = 3
	NakInvalidRDRequest  = 4
)

// AETHKind returns the syndrome's kind bits (AETHAck, AETHRNR or AETHNak).
func AETHKind(syn uint8) uint8 { return syn & aethKind }

// AETHValue returns the low five bits of the syndrome (credit, timer or NAK code).
func AETHValue(syn uint8) uint8 { return syn & aethValue }

// rnrTimerUS are the IBTA minimal RNR NAK timer values in microseconds, by 5-bit code.
var rnrTimerUS = [32]uint32{
	655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920,
	2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880,
	163840, 245760, 327680, 491520,
}

// RNRTimer decodes a 5-bit minimal RNR NAK timer code into a duration.
func RNRTimer(code uint8) time.Duration {
	return time.Duration(rnrTimerUS[code&0x1F]) * time.Microsecond
}

// RNRTimerCode returns the code of the shortest RNR NAK timer at least d (the longest,
// 491.52 ms, if none is; code 0, 655.36 ms, is never chosen).
func RNRTimerCode(d time.Duration) uint8 {
	us := d.Microseconds()
	for c := uint8(1); c < 32; c++ {
		if int64(rnrTimerUS[c]) >= us {
			return c
		}
	}
	return 31
}

// AckTimeout decodes the QP's 5-bit local ACK timeout: 4.096 µs × 2^timeout; 0 means
// infinite and returns 0.
func AckTimeout(code uint8) time.Duration {
	if code == 0 {
		return 0
	}
	return time.Duration(4096<<(code&0x1F)) * time.Nanosecond
}

// MTU enumeration as libibverbs (IBV_MTU_256 = 1 ... IBV_MTU_4096 = 5).
const (
	MTU256  = 1
	MTU512  = 2
	MTU1024 = 3
	MTU2048 = 4
	MTU4096 = 5
)

// MTUBytes returns the payload size of an MTU enum value, or 0 if it is invalid.
func MTUBytes(mtu uint8) int {
	if mtu < MTU256 || mtu > MTU4096 {
		return 0
	}
	return 128 << mtu
}

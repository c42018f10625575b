package wire

import "time"

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

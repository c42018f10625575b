package wire

import (
	"testing"
	"time"
)

func TestRNRTimerCode(t *testing.T) {
	for c := uint8(1); c < 32; c++ {
		if got := RNRTimerCode(RNRTimer(c)); got != c {
			t.Errorf("code %d: round trip %d", c, got)
		}
		if got := RNRTimerCode(RNRTimer(c) - time.Microsecond); got != c {
			t.Errorf("just under code %d: %d", c, got)
		}
	}
	if RNRTimerCode(0) != 1 || RNRTimerCode(time.Second) != 31 {
		t.Error("out of range")
	}
}

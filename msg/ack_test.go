package msg

import (
	"testing"
	"time"
)

// Acknowledgements lost, partial (head flag only), or corrupt leave the transfer pending
// until a complete one arrives (the sender asks again after AckTimeout).
func TestEnlargeAckFaults(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(b []byte) []byte
	}{
		{"lost", func([]byte) []byte { return nil }},
		{"partial", func(b []byte) []byte { return b[:4] }},
		{"corrupt", func(b []byte) []byte { b[10] ^= 0xFF; return b }},
		{"stale", func(b []byte) []byte { b[0]++; b[36]++; return b }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spoiled := 0
			cfg := Config{AckTimeout: 20 * time.Millisecond}
			cfg.hooks = &testHooks{ack: func(to int, b []byte) []byte {
				if spoiled < 2 {
					spoiled++
					return tc.mod(b)
				}
				return b
			}}
			comms := newJob(t, 2, cfg)
			sendAll(t, comms, 0, 1, []int{10, 4000, 10})
			s := comms[0].Stats()
			if s.AckResends < 2 {
				t.Errorf("%d acknowledgements asked again, want at least 2", s.AckResends)
			}
			if tc.name != "lost" && tc.name != "stale" && comms[0].LabStats().AckPartialSeen == 0 {
				t.Errorf("no partial acknowledgement seen")
			}
		})
	}
}

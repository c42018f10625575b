package verbs_test

import (
	"strings"
	"testing"

	"github.com/softrnic/softrnic/verbs"
)

// Every vendor error has a name that says what happened; a peer's NAK names its code.
func TestVendorErrString(t *testing.T) {
	for v, want := range map[verbs.VendorErr]string{
		verbs.VendorRetryTimer:     "local ACK timeout",
		verbs.VendorRNRTimer:       "RNR retries exhausted",
		verbs.VendorUnreachable:    "port closed",
		verbs.VendorRevoked:        "deregistered",
		verbs.VendorRemoteNAK | 2:  "peer NAK: remote access error",
		verbs.VendorRemoteNAK | 1:  "peer NAK: invalid request",
		verbs.VendorOpcodeOrder:    "opcode",
		verbs.VendorErr(0x7777777): "vendor error 0x7777777",
	} {
		if got := v.String(); !strings.Contains(got, want) {
			t.Errorf("VendorErr(%#x).String() = %q, want it to say %q", uint32(v), got, want)
		}
	}
	if code, ok := (verbs.VendorRemoteNAK | 3).NAKCode(); !ok || code != 3 {
		t.Errorf("NAKCode of a remote operational error NAK: %d, %v", code, ok)
	}
	if _, ok := verbs.VendorRetryTimer.NAKCode(); ok {
		t.Error("the retry timer is not a NAK")
	}
}

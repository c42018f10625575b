package perf

import (
	"net"
	"testing"
)

// A peer on a loopback address shares this host; one on an address no interface of this
// host has (TEST-NET-1) does not.
func TestSameHost(t *testing.T) {
	for _, c := range []struct {
		ip   string
		want bool
	}{{"127.0.0.1", true}, {"127.0.0.2", true}, {"::1", true}, {"192.0.2.1", false}} {
		if got := sameHost(&net.TCPAddr{IP: net.ParseIP(c.ip), Port: 1}); got != c.want {
			t.Errorf("sameHost(%s) = %v, want %v", c.ip, got, c.want)
		}
	}
	if sameHost(&net.UDPAddr{IP: net.ParseIP("127.0.0.1")}) {
		t.Error("a UDP address: want false (control connections are TCP)")
	}
}

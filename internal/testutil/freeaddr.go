package testutil

import (
	"net"
	"testing"
)

// FreeTCPAddr returns host:port of a TCP port on 127.0.0.1 that nothing listens on now,
// for a test whose server must be given its address before it starts (a rendezvous).
func FreeTCPAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

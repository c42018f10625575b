package netio

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
)

// Four Conns share one address and port (Config.ReusePort); with SteerByQP each datagram
// goes to the socket numbered by the destination QP in its BTH, mod 4: sockets 0-3 each
// receive exactly the datagrams for their QPs, whatever the sender. A datagram too short
// for a BTH goes to socket 0.
func TestSteerByQP(t *testing.T) {
	const queues, per = 4, 5
	var conns []*Conn
	local := netip.MustParseAddrPort("127.0.0.1:0")
	for i := 0; i < queues; i++ {
		c, err := Listen(Config{Local: local, ReusePort: true, DisableGRO: true})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		local = c.LocalAddr()
		conns = append(conns, c)
	}
	if err := conns[0].SteerByQP(queues); err != nil {
		t.Fatal(err)
	}
	u, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(local))
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	for k := 0; k < queues*per; k++ {
		qpn := uint32(0x10000*k + k) // high bits vary too: only QPN mod 4 counts
		pkt := make([]byte, 40)
		binary.BigEndian.PutUint32(pkt[4:], qpn&0xFFFFFF|0xAB<<24) // a reserved byte set
		if _, err := u.Write(pkt); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := u.Write([]byte{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	for i, c := range conns {
		want := per
		if i == 0 {
			want++
		}
		r := recvAll(t, c, want, 64)
		for _, d := range r.data {
			if len(d) < 8 {
				if i != 0 {
					t.Errorf("socket %d got the short datagram", i)
				}
				continue
			}
			if q := binary.BigEndian.Uint32(d[4:]) & 0xFFFFFF; int(q%queues) != i {
				t.Errorf("socket %d got QP %#x", i, q)
			}
		}
		if n, _ := c.Poll(c.NewRecvBatch(8, 64)); n != 0 {
			t.Errorf("socket %d got %d more datagrams than its QPs'", i, n)
		}
	}
}

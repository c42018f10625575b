package netio

import (
	"bytes"
	"net/netip"
	"testing"
)

func pair(t *testing.T, cfgA Config) (*Conn, *Conn) {
	t.Helper()
	if !cfgA.Local.IsValid() {
		cfgA.Local = netip.MustParseAddrPort("127.0.0.1:0")
	}
	a, err := Listen(cfgA)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Listen(Config{Local: netip.MustParseAddrPort("127.0.0.2:0")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// recvAll receives until want datagrams (segments) arrived, waiting in the poller.
func recvAll(t *testing.T, c *Conn, want int) [][]byte {
	t.Helper()
	rb := c.NewRecvBatch(8, 2048)
	var got [][]byte
	err := c.Serve(func() bool {
		for {
			n, err := c.Poll(rb)
			if err != nil {
				t.Error(err)
				return true
			}
			if n == 0 {
				return len(got) >= want
			}
			for i := 0; i < n; i++ {
				d, seg, _ := rb.Datagram(i)
				if seg == 0 {
					seg = len(d)
				}
				for len(d) > 0 {
					k := min(seg, len(d))
					got = append(got, append([]byte(nil), d[:k]...))
					d = d[k:]
				}
			}
			if len(got) >= want {
				return true
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func TestSendRecvGSO(t *testing.T) {
	a, b := pair(t, Config{})
	dst, err := a.MakeAddr(b.LocalAddr())
	if err != nil {
		t.Fatal(err)
	}
	sb := NewSendBatch(64, 256, 4096)
	var want [][]byte
	for i := 0; i < 20; i++ {
		n := 1000
		if i == 9 || i == 19 {
			n = 300 // a short last segment ends a GSO group
		}
		hdr := sb.Alloc(4)
		copy(hdr, []byte{byte(i), 1, 2, 3})
		pay := bytes.Repeat([]byte{byte(i)}, n-4)
		sb.Begin(&dst)
		sb.Add(hdr)
		sb.Add(pay)
		sb.End()
		want = append(want, append(append([]byte{}, hdr...), pay...))
	}
	if err := a.Send(sb); err != nil {
		t.Fatal(err)
	}
	got := recvAll(t, b, len(want))
	if len(got) != len(want) {
		t.Fatalf("got %d datagrams, want %d", len(got), len(want))
	}
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("datagram %d differs", i)
		}
	}
	if a.GSO() && a.GSOSends.Load() == 0 {
		t.Fatal("GSO available but not used")
	}
}

func TestParseFaults(t *testing.T) {
	f, err := ParseFaults("loss=0.01,reorder=0.02,dup=0.005,corrupt=0.001,seed=7")
	if err != nil || f.Loss != 0.01 || f.Reorder != 0.02 || f.Dup != 0.005 || f.Corrupt != 0.001 || f.Seed != 7 {
		t.Fatalf("%+v %v", f, err)
	}
	for _, bad := range []string{"loss", "loss=2", "bogus=0.1", "seed=x"} {
		if _, err := ParseFaults(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if f, _ := ParseFaults(""); f.Active() {
		t.Fatal("empty is active")
	}
}

func TestFaultFilter(t *testing.T) {
	// Datagram k: 0 dropped, 1 duplicated, 2 corrupted, 3 delayed behind 4 and 5.
	a, b := pair(t, Config{FaultFilter: func(p []byte) Verdict {
		switch p[0] {
		case 0:
			return Verdict{Action: Drop}
		case 1:
			return Verdict{Action: Duplicate}
		case 2:
			return Verdict{Action: Corrupt}
		case 3:
			return Verdict{Action: Delay, After: 2}
		}
		return Verdict{Action: Deliver}
	}})
	dst, _ := a.MakeAddr(b.LocalAddr())
	sb := NewSendBatch(16, 16, 1024)
	for i := 0; i < 6; i++ {
		h := sb.Alloc(64)
		for j := range h {
			h[j] = byte(i)
		}
		sb.Begin(&dst)
		sb.Add(h)
		sb.End()
	}
	if err := a.Send(sb); err != nil {
		t.Fatal(err)
	}
	got := recvAll(t, b, 6)
	var order []byte
	for _, g := range got {
		order = append(order, g[5])
	}
	fc := a.FaultCounters()
	if fc.Lost != 1 || fc.Duplicated != 1 || fc.Corrupted != 1 || fc.Reordered != 1 {
		t.Fatalf("counters %+v", fc)
	}
	// Expected arrival: 1 1 2' 4 5 3
	if len(got) != 6 || got[0][5] != 1 || got[1][5] != 1 || got[3][5] != 4 || got[4][5] != 5 || got[5][5] != 3 {
		t.Fatalf("order %v", order)
	}
	diff := 0
	for j := range got[2] {
		diff += bitsDiff(got[2][j], 2)
	}
	if diff != 1 {
		t.Fatalf("corrupted datagram differs in %d bits", diff)
	}
}

func bitsDiff(a, b byte) int {
	n := 0
	for x := a ^ b; x != 0; x &= x - 1 {
		n++
	}
	return n
}

// TestSegmentID checks Config.SegmentID: in a GSO send, datagram k of a run of equal-sized
// datagrams goes out with its trailer adjusted for segment k (the first of each run is
// segment 0, untouched), from a copy: the batch's memory keeps the original, and a
// duplicate (which shares it) is adjusted for its own place.
func TestSegmentID(t *testing.T) {
	mark := func(last4 []byte, length int, seg uint16) {
		last4[0] ^= byte(seg)
		last4[1] ^= byte(length >> 8)
	}
	dup := func(p []byte) Verdict {
		if p[0] == 2 {
			return Verdict{Action: Duplicate}
		}
		return Verdict{Action: Deliver}
	}
	for _, withDup := range []bool{false, true} {
		cfg := Config{SegmentID: mark}
		if withDup {
			cfg.FaultFilter = dup
		}
		a, b := pair(t, cfg)
		if !a.GSO() {
			t.Skip("no UDP GSO here")
		}
		dst, _ := a.MakeAddr(b.LocalAddr())
		sb := NewSendBatch(16, 64, 4096)
		var trailers [][]byte
		for i := 0; i < 6; i++ {
			h := sb.Alloc(100)
			for j := range h {
				h[j] = byte(i)
			}
			tr := sb.Alloc(6) // 2 bytes of pad, 4 of ICRC
			copy(tr, []byte{0, 0, 0xA0, 0xB0, 0xC0, 0xD0})
			trailers = append(trailers, tr)
			sb.Begin(&dst)
			sb.Add(h)
			sb.Add(tr)
			sb.End()
		}
		if err := a.Send(sb); err != nil {
			t.Fatal(err)
		}
		n := 6
		if withDup {
			n = 7
		}
		got := recvAll(t, b, n)
		if len(got) != n {
			t.Fatalf("dup %v: %d datagrams, want %d", withDup, len(got), n)
		}
		for k, g := range got {
			want := []byte{0xA0 ^ byte(k), 0xB0 ^ byte(106>>8), 0xC0, 0xD0}
			if k == 0 {
				want = []byte{0xA0, 0xB0, 0xC0, 0xD0}
			}
			if tail := g[len(g)-4:]; !bytes.Equal(tail, want) {
				t.Errorf("dup %v: datagram %d (%x) ends %x, want %x", withDup, k, g[0], tail, want)
			}
		}
		for i, tr := range trailers {
			if !bytes.Equal(tr[2:], []byte{0xA0, 0xB0, 0xC0, 0xD0}) {
				t.Errorf("dup %v: the batch's trailer %d was changed: %x", withDup, i, tr)
			}
		}
	}
}

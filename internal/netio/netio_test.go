package netio

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/internal/testutil"
)

// paths runs f on the batched path (recvmmsg and sendmmsg, with GSO and GRO where the
// kernel has them) and on the portable path that systems other than Linux take (one
// recvmsg or sendmsg per datagram), which Config.portable makes Linux take too.
func paths(t *testing.T, f func(t *testing.T, portable bool)) {
	t.Run("batched", func(t *testing.T) { f(t, false) })
	t.Run("portable", func(t *testing.T) { f(t, true) })
}

// pair opens a Conn with cfgA (on 127.0.0.1 unless it says otherwise) and another one on
// 127.0.0.1 that takes the same path. (Only 127.0.0.1 is on darwin's and the BSDs'
// loopback interface unless more addresses are added.)
func pair(t *testing.T, cfgA Config) (*Conn, *Conn) {
	return pairWith(t, cfgA, Config{portable: cfgA.portable})
}

// pairWith opens a Conn with cfgA and one with cfgB (each on 127.0.0.1 unless it says
// otherwise); both are closed when the test ends.
func pairWith(t *testing.T, cfgA, cfgB Config) (*Conn, *Conn) {
	t.Helper()
	for _, c := range []*Config{&cfgA, &cfgB} {
		if !c.Local.IsValid() {
			c.Local = netip.MustParseAddrPort("127.0.0.1:0")
		}
	}
	a, err := Listen(cfgA)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Listen(cfgB)
	if err != nil {
		a.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	if cfgA.portable && (a.mmsg || a.GSO() || a.GRO() || b.mmsg || b.GSO() || b.GRO()) {
		t.Fatal("portable Conn uses recvmmsg/sendmmsg, GSO or GRO")
	}
	return a, b
}

// received is what recvAll got: the datagrams (GRO segments split), their senders, and
// the most datagrams one Poll returned.
type received struct {
	data  [][]byte
	from  []netip.AddrPort
	maxN  int
	polls int
}

// recvAll receives until want datagrams (segments) arrived, waiting in the poller, with a
// batch of 8 buffers of bufSize bytes.
func recvAll(t *testing.T, c *Conn, want, bufSize int) received {
	t.Helper()
	return recvWith(t, c, c.NewRecvBatch(8, bufSize), want)
}

// recvWith is recvAll into the batch rb (which earlier receives may have used). If the
// datagrams do not all come within testutil.WaitLimit, c is closed and the test fails.
func recvWith(t *testing.T, c *Conn, rb *RecvBatch, want int) received {
	t.Helper()
	var r received
	guard := time.AfterFunc(testutil.WaitLimit, func() { c.Close() })
	defer guard.Stop()
	err := c.Serve(func() bool {
		for {
			n, err := c.Poll(rb)
			if err != nil {
				t.Error(err)
				return true
			}
			if n == 0 {
				return len(r.data) >= want
			}
			if n != rb.Len() {
				t.Errorf("Poll returned %d, Len %d", n, rb.Len())
			}
			r.polls++
			r.maxN = max(r.maxN, n)
			for i := 0; i < n; i++ {
				d, seg, from := rb.Datagram(i)
				if seg == 0 {
					seg = len(d)
				}
				for len(d) > 0 {
					k := min(seg, len(d))
					r.data = append(r.data, append([]byte(nil), d[:k]...))
					r.from = append(r.from, from)
					d = d[k:]
				}
			}
			if len(r.data) >= want {
				return true
			}
		}
	})
	if err != nil {
		t.Fatalf("%v after %d of %d datagrams", err, len(r.data), want)
	}
	return r
}

// A batch of 20 datagrams, 18 of 1000 bytes and two short ones, each a header from the
// arena and a payload slice (one a single slice), arrives whole and in order from the
// sender's address: as GSO messages on the batched path where the kernel has GSO, one
// sendmsg per datagram on the portable path. Config.Tap sees each as it leaves.
func TestSendRecv(t *testing.T) {
	paths(t, func(t *testing.T, portable bool) {
		type tapped struct {
			dst     netip.AddrPort
			id      uint16
			data    []byte
			nPieces int
		}
		var taps []tapped
		tap := func(_, dst netip.AddrPort, id uint16, pieces [][]byte) {
			taps = append(taps, tapped{dst, id, bytes.Join(pieces, nil), len(pieces)})
		}
		a, b := pair(t, Config{portable: portable, Tap: tap})
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
			d := append([]byte{byte(i), 1, 2, 3}, bytes.Repeat([]byte{byte(i)}, n-4)...)
			want = append(want, d)
			sb.Begin(&dst)
			if i == 19 {
				sb.Add(d) // one slice: the portable path sends it without gathering
			} else {
				hdr := sb.Alloc(4)
				copy(hdr, d)
				sb.Add(hdr)
				sb.Add(d[4:])
			}
			sb.End()
		}
		if err := a.Send(sb); err != nil {
			t.Fatal(err)
		}
		if sb.Len() != 0 {
			t.Fatal("Send did not reset the batch")
		}
		got := recvAll(t, b, len(want), 2048)
		if len(got.data) != len(want) {
			t.Fatalf("got %d datagrams, want %d", len(got.data), len(want))
		}
		for i := range want {
			if !bytes.Equal(got.data[i], want[i]) {
				t.Fatalf("datagram %d differs", i)
			}
			if got.from[i] != a.LocalAddr() {
				t.Fatalf("datagram %d from %v, want %v", i, got.from[i], a.LocalAddr())
			}
		}
		// Tap sees every datagram, in its pieces, with the identification the kernel gives
		// it: its index in a GSO send, 0 when it goes alone.
		if len(taps) != len(want) {
			t.Fatalf("Tap saw %d datagrams, want %d", len(taps), len(want))
		}
		for i, tp := range taps {
			if !bytes.Equal(tp.data, want[i]) || tp.dst != b.LocalAddr() || tp.nPieces != 2-i/19 {
				t.Errorf("Tap: datagram %d to %v in %d pieces differs", i, tp.dst, tp.nPieces)
			}
			if (!a.GSO() && tp.id != 0) || (tp.id != 0 && tp.id != taps[i-1].id+1) {
				t.Errorf("Tap: datagram %d with identification %d (the one before: %d)", i, tp.id, taps[max(i-1, 0)].id)
			}
		}
		if a.GSO() && taps[1].id != 1 {
			t.Errorf("Tap: the second datagram of a GSO send with identification %d", taps[1].id)
		}
		if n, err := b.Poll(b.NewRecvBatch(1, 64)); n != 0 || err != nil {
			t.Errorf("Poll with nothing queued: %d, %v", n, err)
		}
		if a.GSO() && a.GSOSends.Load() == 0 {
			t.Fatal("GSO available but not used")
		}
		if portable {
			if n := a.SendCalls.Load(); n != 20 || a.GSOSends.Load() != 0 {
				t.Errorf("portable path: %d sends, %d GSO sends; want 20, 0", n, a.GSOSends.Load())
			}
		}
		if e := a.SendErrors.Load(); e != 0 {
			t.Errorf("%d send errors", e)
		}
		if n := b.RecvCalls.Load(); n != uint64(got.polls) {
			t.Errorf("RecvCalls %d, %d Polls returned data", n, got.polls)
		}
	})
}

// One Poll returns as many queued datagrams as the batch has room for (GRO off, so that
// each fills a slot). Whether several are queued when the receiver looks depends on the
// scheduler (loopback delivery may run on another thread), so a round of 16 is sent again
// until one Poll returned more than one; on an idle machine the first round does.
func TestRecvBatchFills(t *testing.T) {
	paths(t, func(t *testing.T, portable bool) {
		a, b := pairWith(t, Config{portable: portable}, Config{portable: portable, DisableGRO: true})
		dst, _ := a.MakeAddr(b.LocalAddr())
		sb := NewSendBatch(16, 16, 1024)
		deadline := time.Now().Add(testutil.WaitLimit)
		for round := 1; ; round++ {
			for i := 0; i < 16; i++ {
				sb.Begin(&dst)
				sb.Add(sb.Alloc(48))
				sb.End()
			}
			if err := a.Send(sb); err != nil {
				t.Fatal(err)
			}
			got := recvAll(t, b, 16, 2048)
			if len(got.data) != 16 {
				t.Fatalf("round %d: %d datagrams, want 16", round, len(got.data))
			}
			if got.maxN > 8 {
				t.Fatalf("a Poll returned %d datagrams into a batch of 8", got.maxN)
			}
			if got.maxN > 1 {
				t.Logf("round %d: up to %d datagrams per Poll, %d Polls", round, got.maxN, got.polls)
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d rounds, never more than one datagram per Poll", round)
			}
		}
	})
}

// A batch's headers are restored after each receive that wrote them, and only those are
// touched: a slot that took a lone datagram (the kernel wrote its control length back as
// 0) takes a coalesced GRO datagram next and still gets the segment size, and a slot
// that nothing was received into keeps working.
func TestRecvHeadersRestored(t *testing.T) {
	paths(t, func(t *testing.T, portable bool) {
		a, b := pair(t, Config{portable: portable})
		dst, _ := a.MakeAddr(b.LocalAddr())
		rb := b.NewRecvBatch(8, 2048)
		sb := NewSendBatch(16, 16, 4096)
		send := func(sizes ...int) [][]byte {
			var want [][]byte
			for i, n := range sizes {
				d := bytes.Repeat([]byte{byte(i + 1)}, n)
				want = append(want, d)
				sb.Begin(&dst)
				sb.Add(d)
				sb.End()
			}
			if err := a.Send(sb); err != nil {
				t.Fatal(err)
			}
			return want
		}
		for round, sizes := range [][]int{{100}, {1000, 1000, 1000, 1000}, {100}, {1000, 1000, 300}} {
			want := send(sizes...)
			got := recvWith(t, b, rb, len(want))
			if len(got.data) != len(want) {
				t.Fatalf("round %d: %d datagrams, want %d (a GRO datagram without its segment size?)", round, len(got.data), len(want))
			}
			for i := range want {
				if !bytes.Equal(got.data[i], want[i]) || got.from[i] != a.LocalAddr() {
					t.Fatalf("round %d: datagram %d (%d bytes from %v) differs", round, i, len(got.data[i]), got.from[i])
				}
			}
		}
		if n, err := b.Poll(rb); n != 0 || err != nil {
			t.Errorf("Poll with nothing queued: %d, %v", n, err)
		}
	})
}

// A datagram larger than the receive buffer arrives truncated and is counted.
func TestRecvTruncated(t *testing.T) {
	paths(t, func(t *testing.T, portable bool) {
		// The receiver without GRO: with it, every buffer holds 64 KiB.
		a, b := pairWith(t, Config{portable: portable}, Config{portable: portable, DisableGRO: true})
		dst, _ := a.MakeAddr(b.LocalAddr())
		sb := NewSendBatch(2, 2, 64)
		big := bytes.Repeat([]byte{7}, 1500)
		sb.Begin(&dst)
		sb.Add(big)
		sb.End()
		if err := a.Send(sb); err != nil {
			t.Fatal(err)
		}
		got := recvAll(t, b, 1, 1000)
		if len(got.data) != 1 || len(got.data[0]) != 1000 || b.RecvTrunc.Load() != 1 {
			t.Fatalf("got %d datagrams (first %d bytes), RecvTrunc %d; want one of 1000, 1", len(got.data), len(got.data[0]), b.RecvTrunc.Load())
		}
	})
}

// Serve sleeps in the poller until a datagram or the Doorbell (an empty datagram from the
// Conn itself) comes, and returns ErrClosed when the Conn is closed while it sleeps; Poll
// and Send fail with ErrClosed after Close.
func TestServeDoorbellClose(t *testing.T) {
	paths(t, func(t *testing.T, portable bool) {
		_, b := pair(t, Config{portable: portable})
		rb := b.NewRecvBatch(4, 2048)
		rang := make(chan struct{}, 1)
		served := make(chan error, 1)
		go func() {
			served <- b.Serve(func() bool {
				for {
					n, err := b.Poll(rb)
					if err != nil {
						return true
					}
					if n == 0 {
						return false
					}
					for i := 0; i < n; i++ {
						if d, _, from := rb.Datagram(i); IsDoorbell(d, from, b.LocalAddr()) {
							rang <- struct{}{}
						}
					}
				}
			})
		}()
		b.Doorbell(0)
		select {
		case <-rang:
		case err := <-served:
			t.Fatalf("Serve returned %v before the doorbell", err)
		case <-time.After(testutil.WaitLimit):
			t.Fatal("the doorbell did not wake Serve")
		}
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-served:
			if !errors.Is(err, ErrClosed) {
				t.Fatalf("Serve returned %v after Close, want ErrClosed", err)
			}
		case <-time.After(testutil.WaitLimit):
			t.Fatal("Close did not end Serve")
		}
		if _, err := b.Poll(rb); !errors.Is(err, ErrClosed) {
			t.Errorf("Poll after Close: %v", err)
		}
		dst, _ := b.MakeAddr(b.LocalAddr())
		sb := NewSendBatch(1, 1, 64)
		sb.Begin(&dst)
		sb.Add([]byte{1})
		sb.End()
		if err := b.Send(sb); !errors.Is(err, ErrClosed) {
			t.Errorf("Send after Close: %v", err)
		}
		b.Doorbell(0) // a no-op after Close
	})
}

// Pending reports a queued datagram without receiving it: false on an empty socket, true
// once a datagram waits (as often as asked), false again after Poll took it, and false
// after Close.
func TestPending(t *testing.T) {
	paths(t, func(t *testing.T, portable bool) {
		_, b := pair(t, Config{portable: portable})
		rb := b.NewRecvBatch(4, 2048)
		if b.Pending() {
			t.Fatal("Pending on an empty socket")
		}
		b.Doorbell(0)
		// Wait in the poller for the datagram (loopback may queue it after Doorbell returns).
		guard := time.AfterFunc(testutil.WaitLimit, func() { b.Close() })
		defer guard.Stop()
		var got [2]bool // the last look: Serve calls ready before it waits, and again after
		err := b.Serve(func() bool {
			got = [2]bool{b.Pending(), b.Pending()}
			return got[0] || b.closed.Load()
		})
		if err != nil || !got[0] || !got[1] {
			t.Fatalf("Pending with a datagram queued: %v (Serve: %v)", got, err)
		}
		if n, err := b.Poll(rb); n != 1 || err != nil {
			t.Fatalf("Poll after Pending: %d, %v (the peek took the datagram?)", n, err)
		}
		if b.Pending() {
			t.Fatal("Pending after Poll took the only datagram")
		}
		b.Doorbell(0)
		b.Close()
		if b.Pending() {
			t.Fatal("Pending after Close")
		}
	})
}

func TestHtons(t *testing.T) {
	var raw unix.RawSockaddrInet4
	raw.Port = htons(0x1234)
	b := (*[2]byte)(unsafe.Pointer(&raw.Port))
	if b[0] != 0x12 || b[1] != 0x34 || htons(htons(4791)) != 4791 {
		t.Fatalf("htons(0x1234) stored as % x", b[:])
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
	paths(t, func(t *testing.T, portable bool) {
		// Datagram k: 0 dropped, 1 duplicated, 2 corrupted, 3 delayed behind 4 and 5.
		a, b := pair(t, Config{portable: portable, FaultFilter: func(p []byte) Verdict {
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
		got := recvAll(t, b, 6, 2048).data
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
	})
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
		got := recvAll(t, b, n, 2048).data
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

// mmsghdr has C's size: msghdr and the length, padded to msghdr's alignment.
func TestMmsghdrSize(t *testing.T) {
	hdr, align := unsafe.Sizeof(unix.Msghdr{}), unsafe.Alignof(unix.Msghdr{})
	if want := (hdr + 4 + align - 1) / align * align; unsafe.Sizeof(mmsghdr{}) != want {
		t.Fatalf("mmsghdr is %d bytes, want %d", unsafe.Sizeof(mmsghdr{}), want)
	}
}

// With Config.SourcePorts, each datagram leaves from the socket BeginFrom named, on both
// paths, GSO runs broken where the source changes, and Tap sees its real source.
func TestSourcePorts(t *testing.T) {
	paths(t, func(t *testing.T, portable bool) {
		var tapSrc []uint16
		a, b := pair(t, Config{portable: portable, SourcePorts: 2, Tap: func(src, _ netip.AddrPort, _ uint16, _ [][]byte) {
			tapSrc = append(tapSrc, src.Port())
		}})
		if a.Sources() != 3 || a.SourcePort(0) != a.LocalAddr().Port() {
			t.Fatalf("%d sources, source 0 on port %d", a.Sources(), a.SourcePort(0))
		}
		dst, _ := a.MakeAddr(b.LocalAddr())
		srcs := []int{0, 0, 1, 1, 1, 2, 0, 2}
		sb := NewSendBatch(16, 32, 1024)
		for i, s := range srcs {
			h := sb.Alloc(100)
			h[0] = byte(i)
			sb.BeginFrom(&dst, s)
			sb.Add(h)
			sb.End()
		}
		if err := a.Send(sb); err != nil {
			t.Fatal(err)
		}
		got := recvAll(t, b, len(srcs), 2048)
		if len(got.data) != len(srcs) {
			t.Fatalf("%d datagrams, want %d", len(got.data), len(srcs))
		}
		for k, d := range got.data {
			i := int(d[0])
			if want := a.SourcePort(srcs[i]); got.from[k].Port() != want {
				t.Errorf("datagram %d from port %d, want source %d's %d", i, got.from[k].Port(), srcs[i], want)
			}
		}
		for i, p := range tapSrc {
			if p != a.SourcePort(srcs[i]) {
				t.Errorf("tap: datagram %d from port %d, want %d", i, p, a.SourcePort(srcs[i]))
			}
		}
	})
}

package wire

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"testing"
)

// TestIDSolver checks that an IDSolver answers as VerifyICRCAnyID does, for valid and
// corrupted packets, before and after it has tables for their lengths, and that a peer
// changing lengths does not make it build tables beyond its bound.
func TestIDSolver(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	f := Flow{Src: netip.MustParseAddr("127.0.0.1"), Dst: netip.MustParseAddr("127.0.0.2"), SrcPort: 0xC123, DstPort: UDPPort, DF: true}
	var s IDSolver
	lengths := []int{4096, 4096, 1024, 333, 4096, 17}
	builds := 0
	for round := range 300 {
		plen := lengths[round%len(lengths)]
		if round > 200 {
			plen = 1 + rng.IntN(3000) // no length twice in a row
		}
		for range 20 {
			pkt := make([]byte, BTHLen+plen+ICRCLen)
			for j := range pkt {
				pkt[j] = byte(rng.Uint32())
			}
			f.IPID = uint16(rng.Uint32())
			n := len(pkt) - ICRCLen
			PutICRC(pkt[n:], f.ICRC(pkt[:n]))
			if rng.IntN(3) == 0 {
				pkt[rng.IntN(len(pkt))] ^= byte(1 + rng.IntN(255))
			}
			before := s.tabs[0].t
			id, ok := s.VerifyICRCAnyID(&f, pkt)
			wid, wok := f.VerifyICRCAnyID(pkt)
			if ok != wok || (ok && id != wid) {
				t.Fatalf("round %d, %d bytes: IDSolver %d, %v; VerifyICRCAnyID %d, %v", round, len(pkt), id, ok, wid, wok)
			}
			if s.tabs[0].t != before {
				builds++
			}
		}
	}
	// 6,000 packets: two tables at once, then at most one more per idTableEvery.
	if max := 2 + 6000/idTableEvery; builds > max {
		t.Errorf("%d tables built, at most %d expected", builds, max)
	}
	if s.tabs[0].t == nil {
		t.Error("no table was built for a stream of one length")
	}
	t.Logf("%d tables built", builds)
}

func BenchmarkIDSolver(b *testing.B) {
	f := Flow{Src: netip.MustParseAddr("127.0.0.1"), Dst: netip.MustParseAddr("127.0.0.2"), SrcPort: 0xC123, DstPort: UDPPort, DF: true, IPID: 4242}
	pkt := make([]byte, BTHLen+4096+ICRCLen)
	n := len(pkt) - ICRCLen
	PutICRC(pkt[n:], f.ICRC(pkt[:n]))
	var s IDSolver
	b.SetBytes(int64(len(pkt)))
	for b.Loop() {
		if _, ok := s.VerifyICRCAnyID(&f, pkt); !ok {
			b.Fatal("rejected")
		}
	}
}

// A Segmenter gives SegmentICRC's answer for every identification of a GSO send, at
// lengths that share its slots and replace each other, from several goroutines at once.
func TestSegmenter(t *testing.T) {
	var sg Segmenter
	lens := []int{4112, 1040, 4112 + 4*8, 2064, 60, 4112, 4096 + 12 + 16 + 4}
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := range 20 {
				for i, tlen := range lens {
					for id := uint16(0); id < 70; id += uint16(1 + g) {
						var want, got [4]byte
						want[0], want[1], want[2], want[3] = byte(round), byte(i), byte(id), 0x5A
						got = want
						SegmentICRC(want[:], tlen, id)
						sg.Fix(got[:], tlen, id)
						if got != want {
							select {
							case errs <- fmt.Sprintf("length %d, identification %d: %x, want %x", tlen, id, got, want):
							default:
							}
							return
						}
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// BenchmarkSegmentICRC adjusts the ICRCs of a GSO send's segments 1-15 of 4 KiB packets:
// the arithmetic for each, and a Segmenter's kept basis.
func BenchmarkSegmentICRC(b *testing.B) {
	var tr [4]byte
	b.Run("arithmetic", func(b *testing.B) {
		for b.Loop() {
			for id := uint16(1); id < 16; id++ {
				SegmentICRC(tr[:], 4112, id)
			}
		}
	})
	b.Run("segmenter", func(b *testing.B) {
		var sg Segmenter
		for b.Loop() {
			for id := uint16(1); id < 16; id++ {
				sg.Fix(tr[:], 4112, id)
			}
		}
	})
}

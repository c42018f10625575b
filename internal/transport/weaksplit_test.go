package transport

import (
	"testing"

	"github.com/softrnic/softrnic/internal/holes"
)

// A packet landing inside a hole cuts it in two: completions beyond the hole stay counted
// on its second part; one the packet itself completes is counted on the first part; each
// part releases its own completions when it closes, in order.
func TestWeakHoleInsideHole(t *testing.T) {
	rg := newWeakRig(t)
	buf := make([]byte, 8*64)
	mr := reg(t, rg.b.d, buf)
	rg.postRecvs(t, mr, 8, 64)
	rg.deliver(rg.b, rg.a, rg.send1(0, 0, []byte{'a'}))
	rg.deliver(rg.b, rg.a, rg.send1(6, 6, []byte{'g'})) // hole [1,6)
	wantHoles(t, "one hole", respHoles(rg.b.qp), holes.Hole{Start: 1, End: 6, Counts: [holes.MaxKinds]uint32{1}})
	rg.deliver(rg.b, rg.a, rg.send1(3, 3, []byte{'d'})) // inside it
	wantHoles(t, "cut", respHoles(rg.b.qp),
		holes.Hole{Start: 1, End: 3, Counts: [holes.MaxKinds]uint32{1}},
		holes.Hole{Start: 4, End: 6, Counts: [holes.MaxKinds]uint32{1}})
	if buf[3*64] != 'd' || buf[6*64] != 'g' {
		t.Fatal("packets beyond holes not placed on arrival")
	}
	// Fill the second part first: its completion now waits on the first part.
	rg.deliver(rg.b, rg.a, rg.send1(4, 4, []byte{'e'}))
	rg.deliver(rg.b, rg.a, rg.send1(5, 5, []byte{'f'}))
	if got := wrids(pollAll(rg.b.cq)); !eqU64(got, []uint64{100}) {
		t.Fatalf("completions with the first part open: %v", got)
	}
	wantHoles(t, "second part closed", respHoles(rg.b.qp), holes.Hole{Start: 1, End: 3, Counts: [holes.MaxKinds]uint32{4}})
	rg.deliver(rg.b, rg.a, rg.send1(2, 2, []byte{'c'}))
	rg.deliver(rg.b, rg.a, rg.send1(1, 1, []byte{'b'}))
	if got := wrids(pollAll(rg.b.cq)); !eqU64(got, []uint64{101, 102, 103, 104, 105, 106}) {
		t.Fatalf("completions after all closed: %v", got)
	}
	for i, c := range []byte("abcdefg") {
		if buf[i*64] != c {
			t.Fatalf("message %d: %q", i, buf[i*64])
		}
	}
}

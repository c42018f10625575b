package holes

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/softrnic/softrnic/internal/wire"
)

const (
	kSend Kind = iota
	kRead
)

func mustCheck(t *testing.T, tr *Tracker) {
	t.Helper()
	if err := tr.Check(); err != nil {
		t.Fatal(err)
	}
}

func psns(items []Item) []wire.PSN {
	var p []wire.PSN
	for _, it := range items {
		p = append(p, it.PSN)
	}
	return p
}

// arrive marks one PSN, holds an item there if it completes one, and advances.
func arrive(t *testing.T, tr *Tracker, p wire.PSN, hold *Item) []Item {
	t.Helper()
	if st := tr.Mark(p, 1); st != Fresh {
		t.Fatalf("Mark(%d) = %d", p, st)
	}
	if hold != nil {
		tr.Hold(*hold)
	}
	out := tr.Advance(nil)
	mustCheck(t, tr)
	return out
}

// A SEND completing beyond one hole is held, counted on that hole, and released when the
// hole closes — by a retransmission arriving last.
func TestSendBeyondHole(t *testing.T) {
	tr := New(100, 64)
	if out := arrive(t, tr, 100, nil); len(out) != 0 || tr.Base() != 101 {
		t.Fatalf("in order: out %v base %d", out, tr.Base())
	}
	// 101 lost; 102 completes a SEND.
	if out := arrive(t, tr, 102, &Item{PSN: 102, Kind: kSend}); len(out) != 0 {
		t.Fatalf("released across a hole: %v", out)
	}
	h := tr.Holes(nil)
	if len(h) != 1 || h[0].Start != 101 || h[0].End != 102 || h[0].Counts[kSend] != 1 {
		t.Fatalf("holes %+v", h)
	}
	// 101 (the retransmission) closes it.
	out := arrive(t, tr, 101, nil)
	if !slices.Equal(psns(out), []wire.PSN{102}) || tr.NumHoles() != 0 || tr.Base() != 103 {
		t.Fatalf("after close: out %v holes %d base %d", out, tr.NumHoles(), tr.Base())
	}
	if tr.Opened != 1 || tr.Closed != 1 || tr.Released != 1 {
		t.Fatalf("counters %d %d %d", tr.Opened, tr.Closed, tr.Released)
	}
}

// Two holes, closing in either order: items wait for every hole before them, and the
// counts of a hole that closes first move to the hole before it.
func TestTwoHoles(t *testing.T) {
	for _, order := range [][2]wire.PSN{{1, 4}, {4, 1}} {
		tr := New(0, 64)
		arrive(t, tr, 0, nil)
		arrive(t, tr, 2, &Item{PSN: 2, Kind: kSend})
		arrive(t, tr, 3, &Item{PSN: 3, Kind: kRead})
		arrive(t, tr, 5, &Item{PSN: 5, Kind: kSend})
		h := tr.Holes(nil)
		if len(h) != 2 || h[0].Counts != [MaxKinds]uint32{1, 1} || h[1].Counts != [MaxKinds]uint32{1, 0} {
			t.Fatalf("holes %+v", h)
		}
		out := arrive(t, tr, order[0], nil)
		if order[0] == 1 {
			// The first hole closes: what is beyond it up to the second hole goes.
			if !slices.Equal(psns(out), []wire.PSN{2, 3}) {
				t.Fatalf("order %v: first close released %v", order, psns(out))
			}
		} else {
			// The second closes first: its item now waits for the first hole.
			h := tr.Holes(nil)
			if len(out) != 0 || len(h) != 1 || h[0].Counts != [MaxKinds]uint32{2, 1} {
				t.Fatalf("order %v: out %v holes %+v", order, out, h)
			}
		}
		out = arrive(t, tr, order[1], nil)
		want := []wire.PSN{5}
		if order[0] == 4 {
			want = []wire.PSN{2, 3, 5}
		}
		if !slices.Equal(psns(out), want) || tr.NumHoles() != 0 || tr.Base() != 6 {
			t.Fatalf("order %v: last close released %v, base %d", order, psns(out), tr.Base())
		}
	}
}

// A packet inside a hole cuts it: what was beyond the hole stays beyond the part after.
func TestHoleSplit(t *testing.T) {
	tr := New(0, 64)
	arrive(t, tr, 0, nil)
	arrive(t, tr, 10, &Item{PSN: 10, Kind: kSend}) // hole [1,10)
	arrive(t, tr, 5, &Item{PSN: 5, Kind: kRead})   // holes [1,5) and [6,10)
	h := tr.Holes(nil)
	if len(h) != 2 || h[0].End != 5 || h[1].Start != 6 || h[0].Counts[kRead] != 1 || h[1].Counts[kSend] != 1 {
		t.Fatalf("holes %+v", h)
	}
	// Fill [1,5) in one range: the READ at 5 goes, the SEND at 10 still waits.
	if tr.Mark(1, 4) != Fresh {
		t.Fatal("mark")
	}
	out := tr.Advance(nil)
	mustCheck(t, tr)
	if !slices.Equal(psns(out), []wire.PSN{5}) || tr.Base() != 6 {
		t.Fatalf("released %v base %d", psns(out), tr.Base())
	}
}

// Duplicates change nothing; ranges past the span are refused whole.
func TestDuplicateAndBeyond(t *testing.T) {
	tr := New(0xFFFFF0, 64) // across the PSN wrap
	arrive(t, tr, 0xFFFFF0, nil)
	arrive(t, tr, 0xFFFFF2, nil)
	if tr.Mark(0xFFFFF0, 1) != Duplicate || tr.Mark(0xFFFFF2, 1) != Duplicate || tr.Mark(0xFFFFE0, 4) != Duplicate {
		t.Fatal("duplicate not recognised")
	}
	if tr.Mark(0xFFFFF1+64, 1) != Beyond || tr.Mark(0xFFFFF1+60, 8) != Beyond {
		t.Fatal("beyond the span accepted")
	}
	if tr.Has(0xFFFFF1+64) || tr.NumHoles() != 1 {
		t.Fatal("refused range recorded")
	}
	// The last PSN of the span is fine, across the wrap.
	if tr.Mark((0xFFFFF1+63)&wire.PSNMask, 1) != Fresh {
		t.Fatal("end of span refused")
	}
	tr.Advance(nil)
	mustCheck(t, tr)
	if got := tr.Received(nil, 8); len(got) != 2 {
		t.Fatalf("received runs %v", got)
	}
}

// model is the reference: holes and counts computed from scratch.
type model struct {
	base, high wire.PSN
	got        map[wire.PSN]bool
	items      []Item
}

func (m *model) holes() []Hole {
	var hs []Hole
	for p := m.base; p != m.high; p++ {
		if m.got[p] {
			continue
		}
		if n := len(hs); n > 0 && hs[n-1].End == p {
			hs[n-1].End++
		} else {
			hs = append(hs, Hole{Start: p, End: p + 1})
		}
	}
	for i := range hs {
		next := m.high
		if i+1 < len(hs) {
			next = hs[i+1].Start
		}
		for _, it := range m.items {
			if it.PSN >= hs[i].End && it.PSN < next {
				hs[i].Counts[it.Kind]++
			}
		}
	}
	return hs
}

// TestAgainstModel delivers messages of random sizes in random orders (with duplicates)
// and compares the tracker with the reference after every packet: the same holes, the
// same counts, and items released exactly when everything before them has arrived, in
// order.
func TestAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 300; round++ {
		// Messages: [first, last] ranges covering 0..n-1; an item at each last PSN.
		n := wire.PSN(1 + rng.IntN(120))
		var lasts []wire.PSN
		msgOf := map[wire.PSN][2]wire.PSN{}
		for p := wire.PSN(0); p < n; {
			l := min(p+wire.PSN(rng.IntN(5)), n-1)
			for q := p; q <= l; q++ {
				msgOf[q] = [2]wire.PSN{p, l}
			}
			lasts = append(lasts, l)
			p = l + 1
		}
		order := rng.Perm(int(n))
		for i := 0; i < int(n)/5; i++ { // some duplicates
			order = append(order, rng.IntN(int(n)))
		}
		tr := New(0, 128)
		m := &model{got: map[wire.PSN]bool{}}
		var released []wire.PSN
		for _, pi := range order {
			p := wire.PSN(pi)
			st := tr.Mark(p, 1)
			if (st == Duplicate) != m.got[p] {
				t.Fatalf("round %d: Mark(%d) = %d, seen %v", round, p, st, m.got[p])
			}
			if st == Duplicate {
				continue
			}
			m.got[p] = true
			if p+1 > m.high {
				m.high = p + 1
			}
			msg := msgOf[p]
			if tr.HasRange(msg[0], uint32(msg[1]-msg[0]+1)) {
				it := Item{PSN: msg[1], Kind: Kind(msg[1] % 2)}
				tr.Hold(it)
				m.items = append(m.items, it)
			}
			out := tr.Advance(nil)
			for m.got[m.base] {
				m.base++
			}
			var want []wire.PSN
			kept := m.items[:0]
			slices.SortFunc(m.items, func(a, b Item) int { return int(a.PSN) - int(b.PSN) })
			for _, it := range m.items {
				if it.PSN < m.base {
					want = append(want, it.PSN)
				} else {
					kept = append(kept, it)
				}
			}
			m.items = kept
			if !slices.Equal(psns(out), want) {
				t.Fatalf("round %d after %d: released %v, want %v", round, p, psns(out), want)
			}
			released = append(released, psns(out)...)
			if err := tr.Check(); err != nil {
				t.Fatalf("round %d after %d: %v", round, p, err)
			}
			if got, want := tr.Holes(nil), m.holes(); !slices.Equal(got, want) {
				t.Fatalf("round %d after %d: holes %+v, want %+v", round, p, got, want)
			}
		}
		if !slices.Equal(released, lasts) || tr.NumHoles() != 0 || tr.Base() != n {
			t.Fatalf("round %d: released %v, want %v (holes %d base %d)", round, released, lasts, tr.NumHoles(), tr.Base())
		}
	}
}

// HasRange answers for ranges of any length, from before Base to past the span, with work
// bounded by the span: PSNs before Base have arrived, PSNs past the span have not.
func TestHasRangeBounded(t *testing.T) {
	const base = 0xFFFFF0 // the range below crosses the 24-bit wrap
	tr := New(base, 64)
	tr.Mark(base+2, 3) // base+2..base+4 arrived, base and base+1 missing
	for _, c := range []struct {
		first wire.PSN
		n     uint32
		want  bool
	}{
		{base - 10, 5, true},                 // wholly before Base
		{base - 10, 10, true},                // up to Base
		{base - 10, 11, false},               // Base is missing
		{base + 2, 3, true},                  // what arrived
		{base + 2, 4, false},                 // one more
		{base - 0x300000, 0xFFFFFF00, false}, // far behind, reaching past the span
		{base + 63, 1, false},                // last PSN of the span, not arrived
		{base + 64, 1, false},                // past the span
		{base - 1, 0, true},                  // empty
	} {
		if got := tr.HasRange(c.first&wire.PSNMask, c.n); got != c.want {
			t.Errorf("HasRange(%#x, %#x) = %v, want %v", c.first&wire.PSNMask, c.n, got, c.want)
		}
	}
}

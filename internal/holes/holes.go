// Package holes tracks which packet sequence numbers (PSNs) of a stream have arrived when
// packets may arrive in any order, and keeps, for each hole in the sequence space, what
// completed beyond it — so that work done out of order is delivered in order when the
// hole closes.
//
// It is the bookkeeping of softrnic's weakly-ordered mode: packets are placed in memory
// the moment they arrive, but the completions they cause (receive CQEs, READ responses
// held for a doorbell, atomics, finished READ work requests) are held, counted on the hole
// they wait for, and released in PSN order once every PSN before them has arrived.
//
// A Tracker follows a window of PSNs from Base (the first PSN not yet received) through a
// bounded span. A hole is a maximal run of missing PSNs below High (one past the highest
// PSN received). Each hole counts the items held beyond it, up to the next hole. When a
// hole fills its counts move to the hole before it; when the first hole fills, Base moves to
// the next hole and every item before it is released.
package holes

import (
	"fmt"

	"github.com/softrnic/softrnic/internal/wire"
)

// MaxKinds bounds the number of item kinds a Tracker counts.
const MaxKinds = 4

// Kind says what a held item is; its meaning is the caller's.
type Kind uint8

// Item is something that completed at PSN but may only be delivered once every PSN before
// it has arrived. Ref is the caller's handle.
type Item struct {
	PSN  wire.PSN
	Kind Kind
	Ref  uint32
}

// Hole is a run [Start, End) of missing PSNs, with the number of items of each kind held
// beyond it (between End and the next hole).
type Hole struct {
	Start, End wire.PSN
	Counts     [MaxKinds]uint32
}

// Size returns the number of PSNs missing in the hole.
func (h Hole) Size() uint32 { return uint32(h.End-h.Start) & wire.PSNMask }

// Status is the outcome of Mark.
type Status uint8

// Mark outcomes.
const (
	Fresh     Status = iota // at least one PSN of the range was new
	Duplicate               // every PSN of the range had arrived before
	Beyond                  // part of the range lies past the span: nothing was recorded
)

// Tracker is the arrival bitmap, the hole list and the held items of one PSN stream.
type Tracker struct {
	base  wire.PSN
	high  wire.PSN
	span  uint32
	bits  []uint64 // bit p%span for PSN p in [base, base+span)
	holes []Hole
	items []Item
	ahead uint32 // PSNs received at or past base

	// Counters.
	Opened, Closed uint64 // holes
	Released       uint64 // items released
}

// New returns a tracker whose first expected PSN is base and which can track span PSNs
// past it (rounded up to a power of two, at least 64, at most 2^23).
func New(base wire.PSN, span uint32) *Tracker {
	s := uint32(64)
	for s < span && s < 1<<23 {
		s <<= 1
	}
	t := &Tracker{span: s, bits: make([]uint64, s/64)}
	t.Reset(base)
	return t
}

// Reset forgets everything and expects base next.
func (t *Tracker) Reset(base wire.PSN) {
	base &= wire.PSNMask
	t.base, t.high = base, base
	t.ahead = 0
	clear(t.bits)
	t.holes = t.holes[:0]
	clear(t.items)
	t.items = t.items[:0]
}

// Base returns the first PSN not yet received: every PSN before it has arrived.
func (t *Tracker) Base() wire.PSN { return t.base }

// High returns one past the highest PSN received.
func (t *Tracker) High() wire.PSN { return t.high }

// Span returns how many PSNs past Base can be tracked.
func (t *Tracker) Span() uint32 { return t.span }

func (t *Tracker) bit(p wire.PSN) bool {
	i := uint32(p) & (t.span - 1)
	return t.bits[i/64]&(1<<(i%64)) != 0
}

func (t *Tracker) set(p wire.PSN) {
	i := uint32(p) & (t.span - 1)
	t.bits[i/64] |= 1 << (i % 64)
}

func (t *Tracker) clearBit(p wire.PSN) {
	i := uint32(p) & (t.span - 1)
	t.bits[i/64] &^= 1 << (i % 64)
}

// Has reports whether PSN p has arrived (PSNs before Base have).
func (t *Tracker) Has(p wire.PSN) bool {
	d := p.Diff(t.base)
	if d < 0 {
		return true
	}
	if d >= int32(t.span) {
		return false
	}
	return t.bit(p)
}

// HasRange reports whether every PSN of [first, first+n) has arrived. Its work is
// bounded by the span, whatever first and n are: PSNs before Base have arrived, and a
// range reaching past the span has not.
func (t *Tracker) HasRange(first wire.PSN, n uint32) bool {
	if n == 0 {
		return true
	}
	first &= wire.PSNMask
	if d := first.Diff(t.base); d < 0 {
		below := uint32(-d) // PSNs of the range before base: all arrived
		if n <= below {
			return true
		}
		first, n = t.base, n-below
	}
	if int64(first.Diff(t.base))+int64(n) > int64(t.span) {
		return false
	}
	for i := uint32(0); i < n; i++ {
		if !t.bit(first.Add(i)) {
			return false
		}
	}
	return true
}

// Mark records that PSNs [first, first+n) arrived and updates the holes: a hole the range
// fills closes (its counts move to the hole before it), one it cuts splits (the counts
// stay with the part after), one it touches shrinks; arriving past High opens a hole
// for the PSNs skipped. Mark does not move Base or release anything: call Hold for what
// the arrival completed, then Advance.
func (t *Tracker) Mark(first wire.PSN, n uint32) Status {
	if n == 0 {
		return Duplicate
	}
	first &= wire.PSNMask
	end := first.Add(n)
	if end.Diff(t.base) > int32(t.span) {
		return Beyond
	}
	if end.Diff(t.base) <= 0 {
		return Duplicate
	}
	a := first
	if a.Diff(t.base) < 0 {
		a = t.base
	}
	fresh := false
	for p := a; p != end; p = p.Add(1) {
		if !t.bit(p) {
			t.set(p)
			t.ahead++
			fresh = true
		}
	}
	if !fresh {
		return Duplicate
	}
	// Holes the range overlaps (they only hold PSNs below High).
	hi := end
	if hi.Diff(t.high) > 0 {
		hi = t.high
	}
	if hi.Diff(a) > 0 {
		t.fill(a, hi)
	}
	if end.Diff(t.high) > 0 {
		if a.Diff(t.high) > 0 {
			t.holes = append(t.holes, Hole{Start: t.high, End: a})
			t.Opened++
		}
		t.high = end
	}
	return Fresh
}

// fill updates the holes for PSNs [a, b) (all below High) having arrived.
func (t *Tracker) fill(a, b wire.PSN) {
	for i := 0; i < len(t.holes); i++ {
		h := &t.holes[i]
		if h.End.Diff(a) <= 0 || b.Diff(h.Start) <= 0 {
			continue // no overlap
		}
		coversStart, coversEnd := a.Diff(h.Start) <= 0, b.Diff(h.End) >= 0
		switch {
		case coversStart && coversEnd: // filled: the hole closes
			if i > 0 {
				for k := range h.Counts {
					t.holes[i-1].Counts[k] += h.Counts[k]
				}
			}
			t.holes = append(t.holes[:i], t.holes[i+1:]...)
			t.Closed++
			i--
		case coversStart:
			h.Start = b
		case coversEnd:
			h.End = a
		default: // cut in two: what was beyond the hole is beyond its second part
			second := Hole{Start: b, End: h.End, Counts: h.Counts}
			h.End = a
			h.Counts = [MaxKinds]uint32{}
			t.holes = append(t.holes, Hole{})
			copy(t.holes[i+2:], t.holes[i+1:])
			t.holes[i+1] = second
			t.Opened++
			i++
		}
	}
}

// Hold keeps an item that completed at it.PSN (every PSN of what completed has arrived)
// until everything before it has. It is counted on the hole just before it. Items at or
// before the first hole are released by the next Advance.
func (t *Tracker) Hold(it Item) {
	it.PSN &= wire.PSNMask
	// Items are kept in PSN order; they mostly come in order.
	i := len(t.items)
	for i > 0 && t.items[i-1].PSN.Diff(it.PSN) > 0 {
		i--
	}
	t.items = append(t.items, Item{})
	copy(t.items[i+1:], t.items[i:])
	t.items[i] = it
	for k := len(t.holes) - 1; k >= 0; k-- {
		if it.PSN.Diff(t.holes[k].End) >= 0 {
			t.holes[k].Counts[it.Kind]++
			return
		}
	}
}

// Advance moves Base to the first missing PSN and appends to out, in PSN order, every
// held item that no longer waits for anything.
func (t *Tracker) Advance(out []Item) []Item {
	nb := t.high
	if len(t.holes) > 0 {
		nb = t.holes[0].Start
	}
	for p := t.base; p != nb; p = p.Add(1) {
		t.clearBit(p)
		t.ahead--
	}
	t.base = nb
	k := 0
	for k < len(t.items) && t.items[k].PSN.Diff(nb) < 0 {
		k++
	}
	if k > 0 {
		out = append(out, t.items[:k]...)
		t.items = append(t.items[:0], t.items[k:]...)
		t.Released += uint64(k)
	}
	return out
}

// Holes appends the open holes, in PSN order, to dst.
func (t *Tracker) Holes(dst []Hole) []Hole { return append(dst, t.holes...) }

// Ahead returns how many PSNs at or past Base have arrived (all of them beyond the first
// hole).
func (t *Tracker) Ahead() uint32 { return t.ahead }

// NumHoles returns the number of open holes.
func (t *Tracker) NumHoles() int { return len(t.holes) }

// Held returns the number of items held.
func (t *Tracker) Held() int { return len(t.items) }

// Received appends to dst the runs of PSNs received past Base, as [start, end) pairs:
// what a selective acknowledgement reports. At most max runs are returned.
func (t *Tracker) Received(dst [][2]wire.PSN, max int) [][2]wire.PSN {
	for i, h := range t.holes {
		if len(dst) >= max {
			break
		}
		e := t.high
		if i+1 < len(t.holes) {
			e = t.holes[i+1].Start
		}
		dst = append(dst, [2]wire.PSN{h.End, e})
	}
	return dst
}

// Check verifies the tracker's invariants (for tests): holes are ordered, disjoint and
// inside [Base, High), hold only missing PSNs, are separated by received PSNs, and their
// counts match the held items.
func (t *Tracker) Check() error {
	prevEnd := t.base
	for i, h := range t.holes {
		if i == 0 && h.Start != t.base {
			return fmt.Errorf("first hole starts at %d, base is %d", h.Start, t.base)
		}
		if i > 0 && h.Start.Diff(prevEnd) <= 0 {
			return fmt.Errorf("hole %d [%d,%d) not after %d", i, h.Start, h.End, prevEnd)
		}
		if h.End.Diff(h.Start) <= 0 || h.End.Diff(t.high) >= 0 {
			return fmt.Errorf("hole %d [%d,%d) empty or not below high %d", i, h.Start, h.End, t.high)
		}
		for p := h.Start; p != h.End; p = p.Add(1) {
			if t.bit(p) {
				return fmt.Errorf("hole %d holds received PSN %d", i, p)
			}
		}
		for p := prevEnd; p != h.Start; p = p.Add(1) {
			if !t.bit(p) && p != t.base {
				return fmt.Errorf("PSN %d missing outside any hole", p)
			}
		}
		var want [MaxKinds]uint32
		next := t.high
		if i+1 < len(t.holes) {
			next = t.holes[i+1].Start
		}
		for _, it := range t.items {
			if it.PSN.InWindow(h.End, uint32(next.Diff(h.End))) {
				want[it.Kind]++
			}
		}
		if want != h.Counts {
			return fmt.Errorf("hole %d [%d,%d) counts %v, items say %v", i, h.Start, h.End, h.Counts, want)
		}
		prevEnd = h.End
	}
	if len(t.holes) == 0 && t.base != t.high {
		return fmt.Errorf("no hole but base %d != high %d", t.base, t.high)
	}
	var n uint32
	for p := t.base; p != t.high; p = p.Add(1) {
		if t.bit(p) {
			n++
		}
	}
	if n != t.ahead {
		return fmt.Errorf("%d PSNs received past base, counter says %d", n, t.ahead)
	}
	return nil
}

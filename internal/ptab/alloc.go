package ptab

import (
	crand "crypto/rand"
	"encoding/binary"
	"math/rand/v2"
)

// Allocator hands out indices of a Table that an attacker cannot predict: QP numbers and
// memory key indices. Each index is drawn uniformly from a window of the 24-bit space that
// starts at a random point (fixed per allocator) and is at least four times as wide as the
// number of live indices and at least MinWindow, so a draw finds a free index with
// probability 3/4 or more and carries at least 12 unpredictable bits; the window stays
// narrow enough that the table's chunks are few. A freed index rests: it is not drawn again
// until Quarantine more indices were freed after it, so that a late packet for an old
// object does not reach a new one soon. The generator is seeded from crypto/rand.
//
// An Allocator is not safe for concurrent use: its owner serialises Alloc and Free, as it
// serialises Table.Store.
type Allocator struct {
	reserved uint32 // indices below this are never handed out
	base     uint32 // where the window starts
	rng      *rand.Rand
	resting  map[uint32]struct{}
	ring     []uint32 // the resting indices, oldest at next
	next     int
}

// Sizes of the allocator's window and quarantine.
const (
	MinWindow  = 1 << 12
	Quarantine = 256
)

// NewAllocator returns an allocator that never hands out indices below reserved. With
// randomBase, its window starts at a random point of the space (QP numbers); otherwise at
// reserved (memory keys, whose index space starts small).
func NewAllocator(reserved uint32, randomBase bool) *Allocator {
	var seed [16]byte
	_, _ = crand.Read(seed[:])
	a := &Allocator{
		reserved: reserved,
		rng:      rand.New(rand.NewPCG(binary.LittleEndian.Uint64(seed[:8]), binary.LittleEndian.Uint64(seed[8:]))),
		resting:  make(map[uint32]struct{}, Quarantine),
	}
	if randomBase {
		a.base = uint32(a.rng.IntN(Size))
	}
	return a
}

// Rand returns the allocator's generator (for other unpredictable choices of its owner).
func (a *Allocator) Rand() *rand.Rand { return a.rng }

// Alloc draws an index that is not reserved, not resting and for which inUse is false;
// live is the number of indices in use.
func (a *Allocator) Alloc(live int, inUse func(uint32) bool) uint32 {
	n := max(MinWindow, 4*(live+1))
	n = min((n+MinWindow-1)/MinWindow*MinWindow, Size)
	ok := func(i uint32) bool {
		if i < a.reserved || inUse(i) {
			return false
		}
		_, resting := a.resting[i]
		return !resting
	}
	for k := 0; k < 64; k++ {
		if i := (a.base + uint32(a.rng.IntN(n))) % Size; ok(i) {
			return i
		}
	}
	// 64 misses in a row (probability below 4^-64 unless nearly full): scan from a random
	// point. The caller keeps the table below Size - Quarantine - reserved live indices.
	start := uint32(a.rng.IntN(Size))
	for k := uint32(0); ; k++ {
		if i := (start + k) % Size; ok(i) {
			return i
		}
	}
}

// Free lets index i rest, releasing the one that rested longest.
func (a *Allocator) Free(i uint32) {
	if len(a.ring) < Quarantine {
		a.ring = append(a.ring, i)
	} else {
		delete(a.resting, a.ring[a.next])
		a.ring[a.next] = i
		a.next = (a.next + 1) % Quarantine
	}
	a.resting[i] = struct{}{}
}

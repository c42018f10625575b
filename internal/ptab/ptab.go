// Package ptab is a sparse table from 24-bit indices to pointers with lock-free lookups,
// as RDMA hardware keeps its QP and memory-key tables: a fixed top level of chunk pointers,
// chunks allocated on first use. Writers must serialise among themselves; readers need no
// lock.
package ptab

import "sync/atomic"

const (
	chunkBits = 12
	chunkSize = 1 << chunkBits
	// Size is the number of indices (2^24).
	Size    = 1 << 24
	topSize = Size / chunkSize
)

type chunk[T any] [chunkSize]atomic.Pointer[T]

// Table maps indices in [0, Size) to *T.
type Table[T any] struct {
	top [topSize]atomic.Pointer[chunk[T]]
}

// Load returns the pointer at index i (masked to 24 bits), or nil.
func (t *Table[T]) Load(i uint32) *T {
	i &= Size - 1
	c := t.top[i>>chunkBits].Load()
	if c == nil {
		return nil
	}
	return c[i&(chunkSize-1)].Load()
}

// Store sets index i (masked to 24 bits) to p. Callers serialise Stores.
func (t *Table[T]) Store(i uint32, p *T) {
	i &= Size - 1
	c := t.top[i>>chunkBits].Load()
	if c == nil {
		if p == nil {
			return
		}
		c = new(chunk[T])
		t.top[i>>chunkBits].Store(c)
	}
	c[i&(chunkSize-1)].Store(p)
}

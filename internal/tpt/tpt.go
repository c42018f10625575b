// Package tpt is softrnic's translation and protection table: the registered memory
// regions of one device, found by their 32-bit key (a 24-bit table index and an 8-bit key
// byte), each checked on every access for protection domain, key, access rights and bounds
// before a single byte is read or written.
//
// Lookups are lock-free (two atomic loads); registration and deregistration take a mutex,
// the last in the engine's lock order (internal/lockrank): nothing else is taken under it.
//
// # What an attacker can guess
//
// RoCE carries keys in the clear, so a peer that sees traffic learns them; the table only
// makes keys that were never shown unguessable. Both parts of a key are drawn from a
// generator seeded from crypto/rand when the table is made: the index uniformly from a
// range at least four times the number of live regions and at least 4096 wide (12 bits or
// more), the key byte uniformly from the 255 values other than the one the index last
// had (about 8 bits). A new region's key is therefore one of at least 4096 × 255 ≈ 2^20
// values, independent of the keys before it — not the last key plus one, and the first
// region of a fresh device no likelier one key than another. A key that was deregistered
// comes back only if the same index is drawn again (one chance in the range's width per
// registration, and never within the next 256 deregistrations: a freed index rests) and
// then the same byte (one in 255). Every guess an attacker sends costs
// the connection it arrives on: a bad key ends in a remote access NAK and the QP in ERR.
package tpt

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/softrnic/softrnic/internal/lockrank"
	"github.com/softrnic/softrnic/internal/ptab"
)

// Access is a set of memory access rights, with libibverbs' values.
type Access uint32

// Access rights.
const (
	LocalWrite   Access = 1
	RemoteWrite  Access = 2
	RemoteRead   Access = 4
	RemoteAtomic Access = 8
	// LocalRead is implied by every registration; it is not a libibverbs flag and is only
	// used as a requirement by lookups.
	LocalRead Access = 0
	allAccess        = LocalWrite | RemoteWrite | RemoteRead | RemoteAtomic
)

// Status is the outcome of a checked access.
type Status uint8

// Outcomes of Region.Check.
const (
	OK          Status = iota
	BadKey             // no region has this key (or it was deregistered)
	BadPD              // the region belongs to another protection domain
	NoRights           // the region was not registered with the needed access
	OutOfBounds        // [va, va+len) is not inside the region
)

var statusText = [...]string{"ok", "invalid key", "protection domain mismatch", "access rights missing", "out of bounds"}

func (s Status) String() string {
	if int(s) < len(statusText) {
		return statusText[s]
	}
	return "unknown"
}

// Region is one registered memory region.
type Region struct {
	buf    []byte
	iova   uint64
	access Access
	pd     uint32
	key    uint32
	valid  atomic.Bool
}

// Revoked reports whether r was deregistered. Users that keep a region across packets
// (a multi-packet RDMA WRITE, READ responses, a receive WQE) ask before every access; a
// nil region (a zero-length access, which holds none) is never revoked.
func (r *Region) Revoked() bool { return r != nil && !r.valid.Load() }

// Key returns the region's key (used as both lkey and rkey).
func (r *Region) Key() uint32 { return r.key }

// IOVA returns the address remote peers use for the region's first byte.
func (r *Region) IOVA() uint64 { return r.iova }

// Len returns the region's length in bytes.
func (r *Region) Len() int { return len(r.buf) }

// Access returns the rights the region was registered with.
func (r *Region) Access() Access { return r.access }

// PD returns the protection domain id.
func (r *Region) PD() uint32 { return r.pd }

// Buf returns the registered memory.
func (r *Region) Buf() []byte { return r.buf }

// Check verifies that [va, va+length) lies in the region, that the region belongs to pd
// and was registered with the rights in need, and returns that part of the memory.
func (r *Region) Check(pd uint32, va uint64, length uint64, need Access) ([]byte, Status) {
	if r == nil || !r.valid.Load() {
		return nil, BadKey
	}
	if r.pd != pd {
		return nil, BadPD
	}
	if r.access&need != need {
		return nil, NoRights
	}
	if va < r.iova {
		return nil, OutOfBounds
	}
	off := va - r.iova
	n := uint64(len(r.buf))
	if off > n || length > n-off {
		return nil, OutOfBounds
	}
	return r.buf[off : off+length : off+length], OK
}

const maxIndex = ptab.Size

// Table maps keys to regions.
type Table struct {
	regions ptab.Table[Region]
	mu      lockrank.Mutex
	last    []uint8         // last key byte used per index, so a reused index gets a new key
	indices *ptab.Allocator // draws indices (see the package doc)
	count   atomic.Int64
	max     int
}

// ErrTooMany is returned when the table holds its maximum number of regions.
var ErrTooMany = errors.New("tpt: too many memory regions")

// New returns a table that holds at most max regions (max < 2^24 - 257).
func New(max int) *Table {
	if max <= 0 || max >= maxIndex-ptab.Quarantine-1 {
		max = maxIndex - ptab.Quarantine - 2
	}
	// Index 0 is never used, so key 0 is never valid.
	return &Table{max: max, indices: ptab.NewAllocator(1, false), mu: lockrank.Mutex{Rank: lockrank.TPT}}
}

// Count returns the number of registered regions.
func (t *Table) Count() int { return int(t.count.Load()) }

// Register adds a region for buf with the given IOVA, access rights and protection domain.
func (t *Table) Register(pd uint32, buf []byte, iova uint64, access Access) (*Region, error) {
	if access&^allAccess != 0 {
		return nil, fmt.Errorf("tpt: unknown access bits %#x", uint32(access&^allAccess))
	}
	if access&(RemoteWrite|RemoteAtomic) != 0 && access&LocalWrite == 0 {
		return nil, errors.New("tpt: remote write and remote atomic access require local write")
	}
	if uint64(len(buf)) > ^uint64(0)-iova {
		return nil, errors.New("tpt: region wraps around the address space")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if int(t.count.Load()) >= t.max {
		return nil, ErrTooMany
	}
	idx := t.indices.Alloc(int(t.count.Load()), func(i uint32) bool { return t.regions.Load(i) != nil })
	for int(idx) >= len(t.last) {
		t.last = append(t.last, 0)
	}
	// A new key byte, any but the one this index had last (see the package doc).
	kb := t.last[idx] + 1 + uint8(t.indices.Rand().IntN(255))
	t.last[idx] = kb
	r := &Region{buf: buf, iova: iova, access: access, pd: pd, key: idx<<8 | uint32(kb)}
	r.valid.Store(true)
	t.regions.Store(idx, r)
	t.count.Add(1)
	return r, nil
}

// Deregister removes r; later lookups of its key fail.
func (t *Table) Deregister(r *Region) error {
	if r == nil || !r.valid.Load() {
		return errors.New("tpt: region not registered")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	idx := r.key >> 8
	if t.regions.Load(idx) != r {
		return errors.New("tpt: region not registered")
	}
	r.valid.Store(false)
	t.regions.Store(idx, nil)
	t.indices.Free(idx)
	t.count.Add(-1)
	return nil
}

// Lookup returns the region with this key, or nil.
func (t *Table) Lookup(key uint32) *Region {
	r := t.regions.Load(key >> 8)
	if r == nil || r.key != key {
		return nil
	}
	return r
}

// Check looks key up and checks the access in one step.
func (t *Table) Check(key, pd uint32, va, length uint64, need Access) ([]byte, Status) {
	return t.Lookup(key).Check(pd, va, length, need)
}

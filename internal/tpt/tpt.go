// Package tpt is softrnic's translation and protection table: the registered memory
// regions of one device, found by their 32-bit key (a 24-bit table index and an 8-bit key
// that is not predictable), each checked on every access for protection domain, key,
// access rights and bounds before a single byte is read or written.
//
// Lookups are lock-free (two atomic loads); registration and deregistration take a mutex.
package tpt

import (
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"

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
	mu      sync.Mutex
	next    uint32   // next never-used index
	free    []uint32 // indices free for reuse
	last    []uint8  // last key byte used per index, so a reused index gets a new key
	rng     *rand.Rand
	count   atomic.Int64
	max     int
}

// ErrTooMany is returned when the table holds its maximum number of regions.
var ErrTooMany = errors.New("tpt: too many memory regions")

// New returns a table that holds at most max regions (max < 2^24).
func New(max int) *Table {
	if max <= 0 || max >= maxIndex {
		max = maxIndex - 1
	}
	var seed [16]byte
	_, _ = crand.Read(seed[:])
	return &Table{
		next: 1, // index 0 is never used, so key 0 is never valid
		max:  max,
		rng:  rand.New(rand.NewPCG(binary.LittleEndian.Uint64(seed[:8]), binary.LittleEndian.Uint64(seed[8:]))),
	}
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
	var idx uint32
	if n := len(t.free); n > 0 {
		idx = t.free[n-1]
		t.free = t.free[:n-1]
	} else {
		idx = t.next
		t.next++
	}
	for int(idx) >= len(t.last) {
		t.last = append(t.last, 0)
	}
	// A new key byte: the last one used at this index plus 1..15 at random, so a stale key
	// does not come back for at least 17 registrations of the slot, and the next key is
	// not simply the last one plus one.
	kb := t.last[idx] + 1 + uint8(t.rng.IntN(15))
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
	t.free = append(t.free, idx)
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

//go:build lockcheck

package lockrank

import (
	"bytes"
	"fmt"
	"runtime"
	"strconv"
	"sync"
)

// The lock-order checker (build tag lockcheck): it records, per goroutine, the ranked
// locks held, and panics when a goroutine blocks on a lock whose rank is not above every
// lock it holds. It is slow (a stack read per operation) and meant for test runs.

var held struct {
	mu sync.Mutex
	by map[uint64][]*Mutex
}

func goid() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	id, _ := strconv.ParseUint(string(b[:bytes.IndexByte(b, ' ')]), 10, 64)
	return id
}

func (m *Mutex) check(g uint64) {
	held.mu.Lock()
	defer held.mu.Unlock()
	for _, h := range held.by[g] {
		if m.Rank == 0 || h.Rank >= m.Rank {
			panic(fmt.Sprintf("lockrank: lock order violated: %v (rank %d) taken while holding %v (rank %d)", m.Rank, m.Rank, h.Rank, h.Rank))
		}
	}
}

func (m *Mutex) note(g uint64) {
	held.mu.Lock()
	if held.by == nil {
		held.by = map[uint64][]*Mutex{}
	}
	held.by[g] = append(held.by[g], m)
	held.mu.Unlock()
}

// Lock checks the order, then locks.
func (m *Mutex) Lock() {
	g := goid()
	m.check(g)
	m.Mutex.Lock()
	m.note(g)
}

// TryLock may take any lock (it cannot wait, so it cannot deadlock).
func (m *Mutex) TryLock() bool {
	if !m.Mutex.TryLock() {
		return false
	}
	m.note(goid())
	return true
}

// Unlock forgets the lock for the goroutine that unlocks it.
func (m *Mutex) Unlock() {
	g := goid()
	held.mu.Lock()
	s := held.by[g]
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == m {
			s = append(s[:i], s[i+1:]...)
			break
		}
	}
	if len(s) == 0 {
		delete(held.by, g)
	} else {
		held.by[g] = s
	}
	held.mu.Unlock()
	m.Mutex.Unlock()
}

package main

import (
	"context"
	"encoding/binary"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"
)

// buffer is the one buffer riostream moves every transfer through and maps for the peer
// to write into, as bytes over 64-bit words: the words make the buffer 8-byte aligned
// and give every byte an aligned word that contains it, to load the marker through.
type buffer struct {
	words []uint64
	b     []byte
}

func newBuffer(n int) *buffer {
	w := make([]uint64, (n+7)/8)
	return &buffer{words: w, b: unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), n)}
}

// byteAt loads byte i of the buffer while the peer's RDMA WRITEs may be landing in it.
//
// The device places a WRITE's payload in registered memory with an ordinary copy (in
// the pass that checks its ICRC), as a NIC places it by DMA: it cannot store atomically,
// the payload being any length, and riostream's C peer is written into the same way by
// its NIC. So in Go's terms the marker poll is a data race, which the reading side keeps
// as harmless as it can: it loads the aligned word that holds the byte with
// sync/atomic, so that every poll reads memory again and reads a whole word the copy
// wrote before or after, never a torn one; the byte is then taken out of the word in
// the machine's byte order. The bytes before the marker: ordered mode places a WRITE's
// packets in order, so every packet before the one that carries the marker is in place
// when it is seen (the C tool trusts its NIC for as much); within that last packet the
// order in which another goroutine sees the copy's stores is the machine's, which Go
// does not promise, and -T v would report a byte seen before its store. The race
// detector cannot see any of this ordering, which goes through the network: the tests
// that poll are left out of -race builds.
func (b *buffer) byteAt(i int) byte {
	var w [8]byte
	binary.NativeEndian.PutUint64(w[:], atomic.LoadUint64(&b.words[i/8]))
	return w[i%8]
}

// waitMarker polls byte i until it holds marker (riostream's recv_xfer), or ctx ends.
// It yields its processor between polls, so that runnable goroutines (the other side
// of a run in this process) get to run; after spinPolls polls it also sleeps between
// them: a goroutine that only yields keeps the scheduler from polling the network, and
// the device's receive goroutine, which waits there for the peer's packets, would wake
// only when the runtime's monitor polls it (every 10-20 ms).
func (b *buffer) waitMarker(ctx context.Context, i int, marker byte) error {
	for n := 0; b.byteAt(i) != marker; n++ {
		if n&0x3FF == 0x3FF && ctx.Err() != nil {
			return ctx.Err()
		}
		if n < spinPolls {
			runtime.Gosched()
		} else {
			time.Sleep(pollSleep)
		}
	}
	return nil
}

// spinPolls and pollSleep shape waitMarker's polling: yields first, then sleeps.
const (
	spinPolls = 64
	pollSleep = 20 * time.Microsecond
)

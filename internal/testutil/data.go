package testutil

import (
	"bytes"
	"context"
	"encoding/binary"
	"testing"
)

// Context returns a context that ends when t ends, or after WaitLimit: the failure guard
// of a test's blocking calls that take a context (a dial, an accept, a receive).
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), WaitLimit)
	t.Cleanup(cancel)
	return ctx
}

// Pattern returns n pseudo-random bytes determined by seed: test data in which a byte
// out of place, or from another message, shows.
func Pattern(n int, seed uint64) []byte {
	b := make([]byte, n+7)
	x := seed*0x9E3779B97F4A7C15 + 1
	for i := 0; i < n; i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[i:], x)
	}
	return b[:n:n]
}

// Fill returns n bytes of value b.
func Fill(n int, b byte) []byte { return bytes.Repeat([]byte{b}, n) }

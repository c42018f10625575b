package wire

import (
	"hash/crc32"
	"math/bits"
	"math/rand/v2"
	"strconv"
	"testing"
)

// TestCRCUpdate checks crcUpdate against the standard library over every length to 2 KiB
// and longer ones, from any starting register and at any alignment.
func TestCRCUpdate(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 20000)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	dst := make([]byte, 20000+64)
	check := func(off, n int) {
		t.Helper()
		crc := r.Uint32()
		p := buf[off : off+n]
		want := crc32.Update(crc, crc32.IEEETable, p)
		if got := crcUpdate(crc, p); got != want {
			t.Fatalf("crcUpdate(%#x, %d bytes at %d) = %#x, want %#x", crc, n, off, got, want)
		}
		// crcCopy: the same CRC, the bytes copied to a destination at another alignment,
		// and nothing written beyond them.
		for i := range dst {
			dst[i] = 0xA5
		}
		d := dst[off/2 : off/2+n+16]
		if got := crcCopy(crc, d, p); got != want {
			t.Fatalf("crcCopy(%#x, %d bytes at %d) = %#x, want %#x", crc, n, off, got, want)
		}
		if string(d[:n]) != string(p) {
			t.Fatalf("crcCopy(%d bytes at %d) copied them wrong", n, off)
		}
		for i, c := range dst[:off/2] {
			if c != 0xA5 {
				t.Fatalf("crcCopy(%d bytes at %d) wrote byte %d before its destination", n, off, i)
			}
		}
		for i, c := range d[n:] {
			if c != 0xA5 {
				t.Fatalf("crcCopy(%d bytes at %d) wrote byte %d after its destination", n, off, n+i)
			}
		}
	}
	for n := 0; n <= 2048; n++ {
		check(n%61, n)
	}
	for _, n := range []int{4095, 4096, 4097, 4112, 8192, 9000, 16384, 19000} {
		for off := 0; off < 64; off += 7 {
			check(off, n)
		}
	}
}

// TestFoldConstants derives foldAVX512's constants: x^(D-32) and x^(D+32) modulo the
// CRC-32 polynomial, bit-reflected and shifted left by one, for D = 2048, 512 and 128 bits.
func TestFoldConstants(t *testing.T) {
	xnmod := func(n int) uint32 { // x^n mod P, P = x^32 + 0x04C11DB7, normal bit order
		var r uint32 = 1
		for range n {
			hi := r >> 31
			r <<= 1
			if hi != 0 {
				r ^= 0x04C11DB7
			}
		}
		return r
	}
	k := func(n int) uint64 { return uint64(bits.Reverse32(xnmod(n))) << 1 }
	for _, c := range []struct {
		d      int
		lo, hi uint64
	}{{2048, 0x1322d1430, 0x11542778a}, {512, 0x1c6e41596, 0x154442bd4}, {128, 0xccaa009e, 0x1751997d0}} {
		if k(c.d-32) != c.lo || k(c.d+32) != c.hi {
			t.Errorf("D=%d: constants %#x, %#x; derived %#x, %#x", c.d, c.lo, c.hi, k(c.d-32), k(c.d+32))
		}
	}
}

var crcSink uint32

// BenchmarkCRC compares crcUpdate with the standard library's CRC at a few lengths.
func BenchmarkCRC(b *testing.B) {
	for _, n := range []int{8, 256, 512, 1024, 4096} {
		p := make([]byte, n)
		b.Run("softrnic/"+strconv.Itoa(n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				crcSink = crcUpdate(crcSink, p)
			}
		})
		b.Run("stdlib/"+strconv.Itoa(n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				crcSink = crc32.Update(crcSink, crc32.IEEETable, p)
			}
		})
	}
}

// BenchmarkCRCCopy is what placing a verified payload costs: the CRC then a copy into a
// region larger than the caches' nearest levels (as a receive path fills a 1 MiB MR),
// against crcCopy's one pass.
func BenchmarkCRCCopy(b *testing.B) {
	const n = 4096
	src := make([]byte, n)
	region := make([]byte, 1<<20)
	off := 0
	next := func() []byte {
		off = (off + n) % len(region)
		return region[off : off+n]
	}
	b.Run("separate", func(b *testing.B) {
		b.SetBytes(n)
		for b.Loop() {
			crcSink = crcUpdate(crcSink, src)
			copy(next(), src)
		}
	})
	b.Run("fused", func(b *testing.B) {
		b.SetBytes(n)
		for b.Loop() {
			crcSink = crcCopy(crcSink, next(), src)
		}
	})
}

// FuzzCRCUpdate compares crcUpdate with the standard library on any input.
func FuzzCRCUpdate(f *testing.F) {
	f.Add(uint32(0), make([]byte, 4096))
	f.Add(uint32(0xFFFFFFFF), make([]byte, 600))
	f.Fuzz(func(t *testing.T, crc uint32, p []byte) {
		want := crc32.Update(crc, crc32.IEEETable, p)
		if got := crcUpdate(crc, p); got != want {
			t.Fatalf("crcUpdate(%#x, %d bytes) = %#x, want %#x", crc, len(p), got, want)
		}
		dst := make([]byte, len(p))
		if got := crcCopy(crc, dst, p); got != want || string(dst) != string(p) {
			t.Fatalf("crcCopy(%#x, %d bytes) = %#x, want %#x (copy equal: %v)", crc, len(p), got, want, string(dst) == string(p))
		}
	})
}

package wire

import (
	"hash/crc32"

	"golang.org/x/sys/cpu"
)

// foldMin is the shortest input given to foldAVX512: below it the standard library's CRC
// is as fast (measured with BenchmarkCRC at 256, 1024 and 4096 bytes).
const foldMin = 512

// useFold says whether this processor has the AVX-512 carry-less multiply foldAVX512 needs
// (and the operating system saves the 512-bit registers: cpu.X86.HasAVX512 checks both).
var useFold = cpu.X86.HasAVX512 && cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL &&
	cpu.X86.HasAVX512VPCLMULQDQ && cpu.X86.HasPCLMULQDQ

// foldAVX512 folds p (at least 256 bytes, a multiple of 64) into a 16-byte value whose
// CRC, from a zero register, is the CRC of p from the register crc (raw, not inverted):
// folding keeps the polynomial's remainder. If dst is not nil, p is copied to the
// len(p) bytes there as well.
//
//go:noescape
func foldAVX512(crc uint32, p []byte, dst *byte, out *[16]byte)

// crcUpdate is crc32.Update(crc, crc32.IEEETable, p), faster on long inputs where the
// processor has AVX-512 carry-less multiplies: the ICRC of every payload goes through it,
// once to send and once to verify.
func crcUpdate(crc uint32, p []byte) uint32 {
	if len(p) < smallMax {
		return crcSmall(crc, p)
	}
	if !useFold || len(p) < foldMin {
		return crc32.Update(crc, crc32.IEEETable, p)
	}
	return fold(crc, p, nil)
}

// fold is crcUpdate(crc, p) with foldAVX512 over p's whole 64-byte blocks (len(p) >=
// foldMin), copying those blocks to dst as well if dst is not nil.
func fold(crc uint32, p []byte, dst *byte) uint32 {
	n := len(p) &^ 63
	var st [16]byte
	foldAVX512(^crc, p[:n], dst, &st)
	// crcSmall(^0, st) is the inverted CRC of st from a zero register; continuing from
	// it over the tail gives the standard result.
	return crcSmall(crcSmall(0xFFFFFFFF, st[:]), p[n:])
}

// crcCopy copies src to dst (at least as long; the two must not overlap) and returns
// crcUpdate(crc, src), in one pass over src where crcUpdate folds: a receive path that
// both verifies and places a payload reads it once.
func crcCopy(crc uint32, dst, src []byte) uint32 {
	dst = dst[:len(src)]
	if !useFold || len(src) < foldMin {
		copy(dst, src)
		return crcUpdate(crc, src)
	}
	c := fold(crc, src, &dst[0])
	n := len(src) &^ 63
	copy(dst[n:], src[n:])
	return c
}

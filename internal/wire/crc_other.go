//go:build !amd64

package wire

import "hash/crc32"

// crcUpdate is crc32.Update(crc, crc32.IEEETable, p); amd64 has a faster one for long
// inputs (crc_amd64.go).
func crcUpdate(crc uint32, p []byte) uint32 {
	if len(p) < smallMax {
		return crcSmall(crc, p)
	}
	return crc32.Update(crc, crc32.IEEETable, p)
}

// crcCopy copies src to dst (at least as long) and returns crcUpdate(crc, src).
func crcCopy(crc uint32, dst, src []byte) uint32 {
	copy(dst, src)
	return crcUpdate(crc, src)
}

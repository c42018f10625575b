package wire

// PSNMask keeps the 24 bits of a packet sequence number.
const PSNMask = 0xFFFFFF

// psnHalf is half the PSN space: a PSN less than this far ahead is "after".
const psnHalf = 1 << 23

// PSN is a 24-bit packet sequence number (and any other sequence number in the same
// circular space, such as weak mode's receive and read sequence numbers). Arithmetic wraps
// modulo 2^24 and order is circular: a comes before b when b is less than 2^23 ahead of
// it. A PSN taken from the wire or from a user fits 24 bits; every method keeps it so.
type PSN uint32

// Add returns p + n modulo 2^24.
func (p PSN) Add(n uint32) PSN { return (p + PSN(n)) & PSNMask }

// Diff returns p - q as a signed distance in the circular space, in [-2^23, 2^23).
func (p PSN) Diff(q PSN) int32 {
	d := uint32(p-q) & PSNMask
	if d >= psnHalf {
		return int32(d) - (1 << 24)
	}
	return int32(d)
}

// Before reports whether p comes strictly before q in circular order.
func (p PSN) Before(q PSN) bool { return p.Diff(q) < 0 }

// InWindow reports whether p lies in the n PSNs starting at base: base <= p < base+n in
// circular order (n at most 2^23).
func (p PSN) InWindow(base PSN, n uint32) bool {
	d := p.Diff(base)
	return d >= 0 && uint32(d) < n
}

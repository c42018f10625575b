package wire

// MTU enumeration as libibverbs (IBV_MTU_256 = 1 ... IBV_MTU_4096 = 5).
const (
	MTU256  = 1
	MTU512  = 2
	MTU1024 = 3
	MTU2048 = 4
	MTU4096 = 5
)

// MTUBytes returns the payload size of an MTU enum value, or 0 if it is invalid.
func MTUBytes(mtu uint8) int {
	if mtu < MTU256 || mtu > MTU4096 {
		return 0
	}
	return 128 << mtu
}

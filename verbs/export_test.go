package verbs

import "github.com/softrnic/softrnic/internal/netio"

// WithFilter returns cfg with the exact per-packet fault filter f, which decides the fate
// of every datagram the device sends. It exists so that the external test package can
// drop, duplicate or delay exact packets.
func WithFilter(cfg DeviceConfig, f netio.FilterFunc) DeviceConfig {
	cfg.filter = f
	return cfg
}

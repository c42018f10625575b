package verbs

import "github.com/softrnic/softrnic/internal/netio"

// WithFilter returns cfg with the exact per-packet fault filter f, which decides the fate
// of every datagram the device sends. It exists so that the external test package can
// drop, duplicate or delay exact packets.
func WithFilter(cfg DeviceConfig, f netio.FilterFunc) DeviceConfig {
	cfg.filter = f
	return cfg
}

// SetLink makes c's port as if its address were on interface name of IP MTU mtu.
func SetLink(c *Device, name string, mtu int) {
	c.port.Interface, c.port.LinkMTU, c.port.ActiveMTU = name, mtu, activeMTU(mtu)
}

// ActiveMTU is the active MTU a port derives from its link's MTU.
var ActiveMTU = activeMTU

// CQState reports whether cq is armed in the engine and how many completions it holds
// (for tests' diagnostics).
func CQState(cq *CQ) (armed bool, waiting int) { return cq.cq.Armed(), cq.cq.Len() }

// WaitForHigherPriority makes c's handlers wait for higher-priority ones with events as
// long as it takes (not maxPriorityWait at most), so that dispatch order depends on
// priorities alone, not on how promptly the kernel runs the handlers' threads.
func WaitForHigherPriority(c *Device) { c.priorityWait.Store(-1) }

package verbs

import (
	"net/netip"

	"github.com/softrnic/softrnic/internal/gsiport"
)

// unreachReport is a report that a MAD's destination answered with ICMP port unreachable:
// the destination and what the report quoted of the MAD (its header and a little more).
type unreachReport struct {
	dst   netip.AddrPort
	n     int
	quote [unreachQuote]byte
}

const (
	// unreachQuote is how much of a quoted MAD a report keeps: its common header (24
	// bytes: the transaction ID and attribute a CM matches it by) and the start of its
	// data.
	unreachQuote = 64
	// gsiUnreachReports is how many reports wait for the agent; more are dropped, and
	// the CM's own timers see to what they were about.
	gsiUnreachReports = 16
)

// unreachable queues a report that the host of dst answered a datagram QP1 sent with ICMP
// port unreachable (transport.Device.OnUnreachable: a receive path, engine locks held).
// Only a MAD sent to a QP1, and only if the handler wants reports, is queued.
func (g *gsi) unreachable(dst netip.AddrPort, destQP uint32, payload []byte) {
	if destQP != 1 {
		return
	}
	if h := g.h.Load(); h == nil {
		return
	} else if _, ok := (*h).(gsiport.UnreachableHandler); !ok {
		return
	}
	r := unreachReport{dst: dst}
	r.n = copy(r.quote[:], payload)
	select {
	case g.unreach <- r:
	default:
	}
}

// deliverUnreachable hands a report to the handler (the agent's goroutine, as HandleMAD).
func (g *gsi) deliverUnreachable(r *unreachReport) {
	if h := g.h.Load(); h != nil {
		if uh, ok := (*h).(gsiport.UnreachableHandler); ok {
			uh.PortUnreachable(r.dst, r.quote[:r.n])
		}
	}
}

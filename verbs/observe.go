package verbs

import (
	"context"
	"log/slog"
	"net/netip"

	"github.com/softrnic/softrnic/internal/transport"
)

// QPs returns the device's QPs: those CreateQP made that DestroyQP has not destroyed (QP1,
// the connection manager's, is not one), in no particular order. It is what a monitor
// walks to read each QP's Counters, which it may do while the QPs carry traffic.
func (c *Device) QPs() []*QP {
	c.mu.Lock()
	defer c.mu.Unlock()
	qps := make([]*QP, 0, len(c.qpSet))
	for q := range c.qpSet {
		qps = append(qps, q)
	}
	return qps
}

// CompletionHandlers returns the ids of the device's completion handlers (those not
// removed), in increasing order: the ids HandlerStats takes.
func (c *Device) CompletionHandlers() []int {
	hs := c.handlerSet()
	ids := make([]int, 0, hs.live)
	for id, h := range hs.byID {
		if h != nil {
			ids = append(ids, id)
		}
	}
	return ids
}

// SRQ returns the shared receive queue the QP takes its receive WQEs from (nil: it has
// a receive queue of its own), as ibv_qp's srq field.
func (q *QP) SRQ() *SRQ { return q.init.SRQ }

// Logger returns DeviceConfig.Logger (nil: the device logs nothing). The connection
// manager logs the device's connection events to it.
func (c *Device) Logger() *slog.Logger { return c.log }

// onQPError is the engine's report of a QP that failed (engine locks held): the log
// record is written by a goroutine of its own, so that a slow log handler holds up no
// packet. Only set when the device has a logger.
func (c *Device) onQPError(tq *transport.QP, status uint8) {
	q, _ := tq.Owner.(*QP)
	if q == nil {
		return // QP1's agent reports its own failures
	}
	go c.logQPError(q, WCStatus(status))
}

// logQPError logs a QP's entry into the error state on a failure.
func (c *Device) logQPError(q *QP, status WCStatus) {
	reason := status.String()
	if status == WCWRFlushErr {
		reason = "the responder side failed (the QP's asynchronous event says how)"
	}
	a := q.qp.Query()
	q.mu.Lock()
	ah := q.ah
	q.mu.Unlock()
	attrs := []slog.Attr{slog.String("local", c.Addr().String()), slog.Uint64("qpn", uint64(q.QPNum()))}
	if !ah.DGID.IsZero() {
		port := ah.DestPort
		if port == 0 {
			port = DefaultPort
		}
		attrs = append(attrs, slog.String("remote", netip.AddrPortFrom(ah.DGID.Addr(), port).String()),
			slog.Uint64("remote_qpn", uint64(a.DestQPN)))
	}
	attrs = append(attrs, slog.String("reason", reason))
	c.log.LogAttrs(context.Background(), slog.LevelWarn, "verbs: QP entered the error state", attrs...)
}

package cm

import (
	"context"
	"log/slog"
	"net/netip"
)

// Connection events, the messages of the records the CM logs. Established and closed
// connections are logged at Info, failures at Warn; every record carries the local and
// remote device addresses, the QP numbers known and a reason. A new kind of event gets a
// constant here and a call of conn.logEvent (or, for an event with no connection, of
// logEvent with the device's logger) where it happens; docs/metrics.md lists them.
const (
	evEstablished     = "cm: connection established"
	evClosed          = "cm: connection closed"
	evRejected        = "cm: connection rejected"         // the peer rejected this side's request or reply
	evRejectedRequest = "cm: connection request rejected" // this side rejected a peer's request
	evNoAnswer        = "cm: no answer from the peer"     // the CM's retries exhausted
	evFailed          = "cm: connection failed"           // this side's QP could not be configured
	evPeerGone        = "cm: peer gone"                   // the keep-alive gave up on the peer device
	evPeerRestarted   = "cm: peer restarted"              // a new device (incarnation) at the peer's address
)

// logger is where the connection's events go: its Dial's or Accept's Logger, else its
// device's (verbs.DeviceConfig.Logger), else nowhere.
func (c *conn) logger() *slog.Logger {
	if c.log != nil {
		return c.log
	}
	return c.m.dev.Logger()
}

// logEvent logs a connection event with the connection's addresses and QP numbers (mu
// held; not called per packet or per message, only when a connection changes state).
func (c *conn) logEvent(level slog.Level, event, reason string) {
	l := c.logger()
	if l == nil || !l.Enabled(context.Background(), level) {
		return
	}
	var qpn uint32
	if c.qp != nil {
		qpn = c.qp.QPNum()
	}
	logEvent(l, level, event, c.m.local, c.peer, qpn, c.peerQPN, reason)
}

// logEvent writes one connection event to l (nil: nothing). A zero QP number is left
// out. It is the one place the CM's records are made, so that they all look alike.
func logEvent(l *slog.Logger, level slog.Level, event string, local, remote netip.AddrPort, qpn, remoteQPN uint32, reason string) {
	if l == nil || !l.Enabled(context.Background(), level) {
		return
	}
	attrs := make([]slog.Attr, 0, 5)
	attrs = append(attrs, slog.String("local", local.String()), slog.String("remote", remote.String()))
	if qpn != 0 {
		attrs = append(attrs, slog.Uint64("qpn", uint64(qpn)))
	}
	if remoteQPN != 0 {
		attrs = append(attrs, slog.Uint64("remote_qpn", uint64(remoteQPN)))
	}
	if reason != "" {
		attrs = append(attrs, slog.String("reason", reason))
	}
	l.LogAttrs(context.Background(), level, event, attrs...)
}

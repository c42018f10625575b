//go:build !linux

package netio

// askForReports does nothing here: this system does not report ICMP errors to an
// unconnected UDP socket, and a closed port at a destination is silence.
func (c *Conn) askForReports() {}

// readErrors does nothing: there are no reports to read (c.recverr is false).
func (c *Conn) readErrors() {}

// queuedSendError reports false: a send's error is always the datagram's own here.
func (c *Conn) queuedSendError(error) bool { return false }

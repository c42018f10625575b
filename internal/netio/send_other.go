//go:build !linux

package netio

// sendMmsg is not reached here (Listen leaves c.mmsg false on systems other than Linux):
// it transmits b one datagram at a time, as sendEach does.
func (c *Conn) sendMmsg(b *SendBatch) error { return c.sendEach(b) }

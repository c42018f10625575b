package rsocket

import "fmt"

func Debug(c *Conn) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprintf("rx %+v tx %+v ctrl %d inflight %d err %v qp %v", c.rx, c.tx, c.ctrlAvail, c.inflight, c.err, c.qp.State())
}

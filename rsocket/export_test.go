package rsocket

// Sleepers is how many calls of c sleep until a completion event.
func Sleepers(c *Conn) int { return int(c.sleepers.Load()) }

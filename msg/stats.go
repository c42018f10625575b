package msg

// Stats returns the rank's counters.
func (c *Comm) Stats() Stats {
	var s Stats
	c.call(func() { s = c.stats })
	return s
}

package transport

import "testing"

// Empty polls take the receive path until one held it longer than stallLimit; then they
// look first for lookFor, and take it again after.
func TestStallWatch(t *testing.T) {
	var w stallWatch
	const t0 = int64(1e9)
	if w.looking(t0) {
		t.Fatal("looking before any stall")
	}
	w.held(t0, t0+stallLimit)
	if w.looking(t0 + stallLimit) {
		t.Fatal("looking after a poll that held the receive path no longer than stallLimit")
	}
	end := t0 + stallLimit + 1
	w.held(t0, end)
	if !w.looking(end) || !w.looking(end+lookFor-1) {
		t.Fatal("not looking after a stall")
	}
	if w.looking(end + lookFor) {
		t.Fatal("still looking lookFor after the stall")
	}
}

// A poll on a machine that does not stop threads takes the receive path even with nothing
// queued (one system call for a poll that finds a datagram), and one whose thread stopped
// while holding it makes the next polls look first.
func TestPollLooksAfterStall(t *testing.T) {
	rg := newQPRig(t, newRigConfig(Ordered))
	u := rg.d.q0()
	paused := false
	u.testPause = func() { paused = true }
	u.progress()
	if paused {
		t.Fatal("an empty poll looked first with no stall seen")
	}
	u.stalls.held(rigStart, rigStart+stallLimit+1)
	u.progress()
	if !paused {
		t.Fatal("an empty poll took the receive path after a stall")
	}
}

package osthread

import (
	"runtime"
	"testing"
)

// An Unpark before Park is remembered: Park returns at once, and only once.
func TestParkerRemembersUnpark(t *testing.T) {
	var p Parker
	p.Unpark()
	p.Unpark()
	p.Park()
	if s := p.state.Load(); s != running {
		t.Fatalf("state %d after Park, want running", s)
	}
}

// A thread parked on a Parker wakes when another one unparks it.
func TestParkerWakesSleeper(t *testing.T) {
	var p Parker
	done := make(chan struct{})
	go func() {
		p.Park()
		close(done)
	}()
	for p.state.Load() != sleeping { // until the goroutine is in Park
		runtime.Gosched()
	}
	p.Unpark()
	<-done
}

// AddProcs moves GOMAXPROCS by n, never below 1.
func TestAddProcs(t *testing.T) {
	prev := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(prev)
	AddProcs(2)
	if got := runtime.GOMAXPROCS(0); got != prev+2 {
		t.Errorf("GOMAXPROCS %d after AddProcs(2), want %d", got, prev+2)
	}
	AddProcs(-2)
	if got := runtime.GOMAXPROCS(0); got != prev {
		t.Errorf("GOMAXPROCS %d after AddProcs(-2), want %d", got, prev)
	}
	AddProcs(-prev - 5)
	if got := runtime.GOMAXPROCS(0); got != 1 {
		t.Errorf("GOMAXPROCS %d after AddProcs(%d), want 1", got, -prev-5)
	}
}

package tpt

import (
	"testing"

	"github.com/softrnic/softrnic/internal/ptab"
)

func TestRegisterCheck(t *testing.T) {
	tb := New(4)
	buf := make([]byte, 100)
	r, err := tb.Register(1, buf, 0x1000, LocalWrite|RemoteWrite|RemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	if r.Key()>>8 == 0 {
		t.Fatal("index 0 used")
	}
	cases := []struct {
		key, pd uint32
		va, n   uint64
		need    Access
		want    Status
		name    string
	}{
		{r.Key(), 1, 0x1000, 100, RemoteWrite, OK, "whole region"},
		{r.Key(), 1, 0x1063, 1, RemoteRead, OK, "last byte"},
		{r.Key(), 1, 0x1064, 0, RemoteRead, OK, "empty at end"},
		{r.Key(), 1, 0x1064, 1, RemoteRead, OutOfBounds, "one past end"},
		{r.Key(), 1, 0xFFF, 1, RemoteRead, OutOfBounds, "before start"},
		{r.Key(), 1, 0x1001, ^uint64(0), RemoteRead, OutOfBounds, "length wraps"},
		{r.Key(), 1, ^uint64(0), 2, RemoteRead, OutOfBounds, "va wraps"},
		{r.Key(), 2, 0x1000, 1, RemoteRead, BadPD, "other PD"},
		{r.Key(), 1, 0x1000, 8, RemoteAtomic, NoRights, "no atomic right"},
		{r.Key() ^ 0x01, 1, 0x1000, 1, RemoteRead, BadKey, "wrong key byte"},
		{0, 1, 0x1000, 1, RemoteRead, BadKey, "key 0"},
		{0xFFFFFFFF, 1, 0x1000, 1, RemoteRead, BadKey, "unknown index"},
	}
	for _, c := range cases {
		b, st := tb.Check(c.key, c.pd, c.va, c.n, c.need)
		if st != c.want {
			t.Errorf("%s: %v, want %v", c.name, st, c.want)
		}
		if st == OK && uint64(len(b)) != c.n {
			t.Errorf("%s: slice len %d", c.name, len(b))
		}
		if st == OK && cap(b) != len(b) {
			t.Errorf("%s: slice can reach past the access", c.name)
		}
	}
	old := r.Key()
	if err := tb.Deregister(r); err != nil {
		t.Fatal(err)
	}
	if tb.Deregister(r) == nil {
		t.Fatal("double deregister")
	}
	if _, st := tb.Check(old, 1, 0x1000, 1, RemoteRead); st != BadKey {
		t.Fatal("deregistered key still works")
	}
	r2, _ := tb.Register(1, buf, 0x1000, LocalWrite)
	if r2.Key() == old {
		t.Fatalf("a deregistered key came back at once: %#x", old)
	}
}

// Keys are not guessable from what came before: the first key of fresh tables takes many
// values, consecutive keys of one table are not in sequence, an index used again gets
// another key byte, and a deregistered key does not come back soon.
func TestKeysUnpredictable(t *testing.T) {
	buf := make([]byte, 64)
	first := map[uint32]bool{}
	for i := 0; i < 500; i++ {
		r, err := New(0).Register(1, buf, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		first[r.Key()] = true
	}
	// One of at least 4096 × 255 values: 500 draws collide rarely (expected < 0.2 pairs).
	if len(first) < 495 {
		t.Errorf("the first key of 500 fresh tables took only %d values", len(first))
	}
	tb := New(0)
	var keys []uint32
	close := 0
	for i := 0; i < 1000; i++ {
		r, err := tb.Register(1, buf, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, r.Key())
		if i > 0 {
			if d := int64(r.Key()>>8) - int64(keys[i-1]>>8); d >= -16 && d <= 16 {
				close++
			}
		}
	}
	// Indices drawn from at least 4096: two in a row within 16 of each other about 1% of
	// the time; counting up would make it every time.
	if close > 50 {
		t.Errorf("%d of 999 consecutive keys have indices within 16 of each other", close)
	}
	// Deregister and register again, many times: a stale key never comes back within the
	// quarantine (its index rests).
	seen := map[uint32]int{}
	r, _ := tb.Register(1, buf, 0, 0)
	for i := 0; i < 5000; i++ {
		if j, ok := seen[r.Key()]; ok && i-j <= ptab.Quarantine {
			t.Fatalf("key %#x came back after %d registrations", r.Key(), i-j)
		}
		seen[r.Key()] = i
		if err := tb.Deregister(r); err != nil {
			t.Fatal(err)
		}
		r, _ = tb.Register(1, buf, 0, 0)
	}
}

func TestRegisterErrors(t *testing.T) {
	tb := New(2)
	if _, err := tb.Register(1, nil, 0, RemoteWrite); err == nil {
		t.Fatal("remote write without local write")
	}
	if _, err := tb.Register(1, nil, 0, RemoteAtomic); err == nil {
		t.Fatal("remote atomic without local write")
	}
	if _, err := tb.Register(1, nil, 0, 0x100); err == nil {
		t.Fatal("unknown bit")
	}
	if _, err := tb.Register(1, make([]byte, 16), ^uint64(0)-4, 0); err == nil {
		t.Fatal("wrapping region")
	}
	tb.Register(1, nil, 0, 0)
	tb.Register(1, nil, 0, 0)
	if _, err := tb.Register(1, nil, 0, 0); err != ErrTooMany {
		t.Fatal("limit not enforced")
	}
}

package tpt

import "testing"

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
	if r2.Key() == old || r2.Key()>>8 != old>>8 {
		t.Fatalf("reused index should get a new key: old %#x new %#x", old, r2.Key())
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

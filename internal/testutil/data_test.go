package testutil

import (
	"bytes"
	"testing"
)

func TestPattern(t *testing.T) {
	a, b := Pattern(1000, 1), Pattern(1000, 2)
	if len(a) != 1000 || cap(a) != 1000 || !bytes.Equal(a, Pattern(1000, 1)) || bytes.Equal(a, b) {
		t.Fatal("Pattern is not a function of its seed, or seeds do not tell data apart")
	}
	if !bytes.Equal(Pattern(13, 1), a[:13]) {
		t.Fatal("a shorter pattern is not the start of a longer one")
	}
}

func TestContextEndsWithTest(t *testing.T) {
	var ctx interface{ Err() error }
	t.Run("inner", func(t *testing.T) {
		c := Context(t)
		if _, ok := c.Deadline(); !ok || c.Err() != nil {
			t.Fatal("the context has no deadline, or ended early")
		}
		ctx = c
	})
	if ctx.Err() == nil {
		t.Fatal("the context outlived its test")
	}
}

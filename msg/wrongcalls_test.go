package msg

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/softrnic/softrnic/internal/testutil"
)

// TestWrongCalls checks the errors of calls a user gets wrong: a rank the job does not
// have, a negative tag, slices of the wrong length, an unknown reduction, and any call
// after Close. Each error says what was wrong in the call's words ("there is no rank 5
// in a job of 2 ranks") and wraps ErrInvalid or ErrClosed.
func TestWrongCalls(t *testing.T) {
	comms := newJob(t, 2, Config{})
	c := comms[0]
	ctx := testutil.Context(t)
	b := make([]byte, 8)
	type call struct {
		name   string
		fn     func() error
		target error
		says   string
	}
	wait := func(r *Request) error { _, err := r.Wait(ctx); return err }
	check := func(calls []call) {
		t.Helper()
		for _, k := range calls {
			err := k.fn()
			if !errors.Is(err, k.target) {
				t.Errorf("%s: %v, want an error wrapping %q", k.name, err, k.target)
				continue
			}
			if msg := err.Error(); !strings.HasPrefix(msg, "msg: ") || !strings.Contains(msg, k.says) || strings.Count(msg, "msg: ") > 1 {
				t.Errorf("%s: %q, want one saying %q", k.name, msg, k.says)
			}
		}
	}
	check([]call{
		{"Isend to rank 5", func() error { return wait(c.Isend(b, 5, 1)) }, ErrInvalid, "send to rank 5 with tag 1: invalid argument: there is no rank 5 in a job of 2 ranks"},
		{"Send to rank -1", func() error { return c.Send(ctx, b, -1, 1) }, ErrInvalid, "there is no rank -1 in a job of 2 ranks"},
		{"Send with tag -2", func() error { return c.Send(ctx, b, 1, -2) }, ErrInvalid, "tag -2"},
		{"Irecv from rank 2", func() error { return wait(c.Irecv(b, 2, 1)) }, ErrInvalid, "receive from rank 2 with tag 1: invalid argument: there is no rank 2"},
		{"Bcast from rank 3", func() error { return Bcast(ctx, c, b, 3) }, ErrInvalid, "Bcast from root: invalid argument: there is no rank 3"},
		{"Allreduce of unequal slices", func() error { return Allreduce(ctx, c, []int{1}, []int{1, 2}, Sum) }, ErrInvalid, "Allreduce: invalid argument"},
		{"Allreduce with Op(9)", func() error { return Allreduce(ctx, c, []int{1}, []int{1}, Op(9)) }, ErrInvalid, "unknown Op(9)"},
		{"Allgather too short", func() error { return Allgather(ctx, c, []int{1}, []int{1}) }, ErrInvalid, "Allgather: invalid argument"},
		{"Init rank 2 of 2", func() error { _, err := Init(ctx, Config{Rank: 2, Size: 2}); return err }, ErrInvalid, "Init: invalid argument: rank 2"},
	})
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	check([]call{
		{"Send after Close", func() error { return c.Send(ctx, b, 1, 1) }, ErrClosed, "send to rank 1 with tag 1: the communicator was closed"},
		{"Irecv after Close", func() error { return wait(c.Irecv(b, 1, 1)) }, ErrClosed, "receive from rank 1 with tag 1: the communicator was closed"},
		{"Probe after Close", func() error { _, err := c.Probe(ctx, 1, 1); return err }, ErrClosed, "Probe: "},
		{"Barrier after Close", func() error { return c.Barrier(ctx) }, ErrClosed, "Barrier: "},
	})
	for _, op := range []Op{Sum, Min, Max} {
		if s := op.String(); s == fmt.Sprint(int(op)) || strings.HasPrefix(s, "Op(") {
			t.Errorf("Op %d prints as %q", int(op), s)
		}
	}
}

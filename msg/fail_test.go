package msg

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/testutil"
)

// A receive cancelled by its context is withdrawn: the message it would have matched goes
// to the next receive.
func TestCancelRecv(t *testing.T) {
	comms := newJob(t, 2, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	b := make([]byte, 8)
	if _, err := comms[0].Recv(ctx, b, 1, 3); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Recv: %v, want the context's deadline", err)
	}
	if err := comms[1].Send(testutil.Context(t), []byte("after"), 0, 3); err != nil {
		t.Fatal(err)
	}
	if st, err := comms[0].Recv(testutil.Context(t), b, 1, 3); err != nil || string(b[:st.Count]) != "after" {
		t.Fatalf("Recv after the cancelled one: %+v %q %v", st, b, err)
	}
}

// A rank that dies (its device closed under it) fails every request involving it, on
// the eager and the rendezvous paths, and nothing hangs; other ranks go on.
func TestPeerDies(t *testing.T) {
	comms := newJob(t, 3, Config{})
	ctx := testutil.Context(t)
	// Connect 0-1 and 0-2 first.
	for _, r := range []int{1, 2} {
		if err := comms[r].Send(ctx, []byte("hi"), 0, 1); err != nil {
			t.Fatal(err)
		}
		if _, err := comms[0].Recv(ctx, make([]byte, 2), r, 1); err != nil {
			t.Fatal(err)
		}
	}
	recv := comms[0].Irecv(make([]byte, 10), 1, 7)   // posted, never sent
	big := comms[0].Isend(make([]byte, 1<<20), 1, 8) // rendezvous, never received
	comms[1].dev.Close()                             // rank 1 dies
	for what, r := range map[string]*Request{"posted receive": recv, "rendezvous send": big} {
		if _, err := r.Wait(ctx); !errors.Is(err, ErrPeerGone) {
			t.Errorf("%s after its peer died: %v, want ErrPeerGone", what, err)
		}
	}
	if err := comms[0].Send(ctx, []byte("x"), 1, 9); !errors.Is(err, ErrPeerGone) {
		t.Errorf("send to a dead rank: %v", err)
	}
	if err := comms[2].Send(ctx, []byte("still here"), 0, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := comms[0].Recv(ctx, make([]byte, 10), 2, 2); err != nil {
		t.Errorf("rank 2 after rank 1 died: %v", err)
	}
}

// Sixteen ranks: everyone sends to everyone (small and enlarged), then collectives.
func TestSixteenRanks(t *testing.T) {
	if testing.Short() {
		t.Skip("16 devices")
	}
	const n = 16
	comms := newJob(t, n, Config{})
	each(t, comms, func(c *Comm) error {
		ctx := testutil.Context(t)
		var reqs []*Request
		for to := 0; to < n; to++ {
			reqs = append(reqs, c.Isend(testutil.Pattern(100+to*300, uint64(c.Rank())), to, 4))
		}
		for from := 0; from < n; from++ {
			b := make([]byte, 100+c.Rank()*300)
			if _, err := c.Recv(ctx, b, from, 4); err != nil {
				return err
			}
			if string(b) != string(testutil.Pattern(len(b), uint64(from))) {
				return fmt.Errorf("from %d: wrong data", from)
			}
		}
		for _, r := range reqs {
			if _, err := r.Wait(ctx); err != nil {
				return err
			}
		}
		sum := make([]int64, 1)
		if err := Allreduce(ctx, c, []int64{int64(c.Rank())}, sum, Sum); err != nil {
			return err
		}
		if sum[0] != n*(n-1)/2 {
			return fmt.Errorf("sum %d", sum[0])
		}
		return c.Barrier(ctx)
	})
}

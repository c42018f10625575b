package msg

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/softrnic/softrnic/internal/testutil"
)

// Messages of every path between two ranks, both ways at once: small (eager in the
// first phase), those that need each larger phase, and a rendezvous one.
func TestSendRecvSizes(t *testing.T) {
	comms := newJob(t, 2, Config{})
	sizes := []int{0, 1, 100, 976, 977, 5000, 16000, 100000, 130000, 1 << 20}
	each(t, comms, func(c *Comm) error {
		peer := 1 - c.Rank()
		for i, n := range sizes {
			send := c.Isend(testutil.Pattern(n, uint64(c.Rank()+i)), peer, i)
			got := make([]byte, n)
			st, err := c.Recv(testutil.Context(t), got, peer, i)
			if err != nil {
				return fmt.Errorf("recv %d bytes: %w", n, err)
			}
			if st.Source != peer || st.Tag != i || st.Count != n {
				return fmt.Errorf("status %+v for %d bytes", st, n)
			}
			if !bytes.Equal(got, testutil.Pattern(n, uint64(peer+i))) {
				return fmt.Errorf("%d bytes: wrong data", n)
			}
			if _, err := send.Wait(testutil.Context(t)); err != nil {
				return fmt.Errorf("send %d bytes: %w", n, err)
			}
		}
		return nil
	})
	s := comms[0].Stats()
	t.Logf("rank 0: %+v", s)
	if s.Enlargements != 2 || s.RendezvousSent != 1 {
		t.Errorf("rank 0: %d enlargements (want 2: to 16 KiB, to 128 KiB), %d rendezvous sends (want 1)", s.Enlargements, s.RendezvousSent)
	}
}

// MPI matching: wildcards, non-overtaking order per source and tag, truncation.
func TestMatching(t *testing.T) {
	comms := newJob(t, 3, Config{})
	ctx := testutil.Context(t)
	// Ranks 1 and 2 each send tags 5, 6, 5 to rank 0.
	for _, c := range comms[1:] {
		for i, tag := range []int{5, 6, 5} {
			if err := c.Send(ctx, []byte{byte(c.Rank()), byte(i)}, 0, tag); err != nil {
				t.Fatal(err)
			}
		}
	}
	c := comms[0]
	b := make([]byte, 2)
	// Tag 6 from rank 2 first, then the two tag-5 messages of rank 1 in order.
	if st, err := c.Recv(ctx, b, 2, 6); err != nil || st.Source != 2 || b[1] != 1 {
		t.Fatalf("recv(2, 6): %+v %v %v", st, b, err)
	}
	for want := 0; want <= 2; want += 2 {
		if st, err := c.Recv(ctx, b, 1, 5); err != nil || b[0] != 1 || int(b[1]) != want {
			t.Fatalf("recv(1, 5): %+v %v %v, want message %d", st, b, err, want)
		}
	}
	// Wildcards take what is left, per source in order.
	seen := map[int][]int{}
	for i := 0; i < 3; i++ {
		st, err := c.Recv(ctx, b, AnySource, AnyTag)
		if err != nil {
			t.Fatal(err)
		}
		seen[st.Source] = append(seen[st.Source], int(b[1]))
	}
	if fmt.Sprint(seen[1]) != "[1]" || fmt.Sprint(seen[2]) != "[0 2]" {
		t.Errorf("wildcard receives: %v", seen)
	}
	// Probe, then truncation.
	if err := comms[1].Send(ctx, testutil.Pattern(50, 1), 0, 9); err != nil {
		t.Fatal(err)
	}
	st, err := c.Probe(ctx, AnySource, 9)
	if err != nil || st.Source != 1 || st.Count != 50 {
		t.Fatalf("probe: %+v %v", st, err)
	}
	small := make([]byte, 10)
	st, err = c.Recv(ctx, small, 1, 9)
	if !errors.Is(err, ErrTruncated) || st.Count != 50 || !bytes.Equal(small, testutil.Pattern(50, 1)[:10]) {
		t.Errorf("truncated receive: %+v %v", st, err)
	}
}

package msg

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/testutil"
)

// rvResult is one rank's rendezvous outcome.
type rvResult struct {
	rank int
	book []netip.AddrPort
	wire uint64
	stop func() // ends rank 0's rendezvous
	err  error
}

// startRank runs rank's rendezvous of job (size ranks, at root) in a goroutine, after
// the functions in with have set its hooks.
func startRank(ctx context.Context, job string, rank, size int, root string, timeout time.Duration, with ...func(*rendezvous)) <-chan rvResult {
	out := make(chan rvResult, 1)
	rv := &rendezvous{rank: rank, size: size, job: job, root: root, timeout: timeout,
		dev: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(40000+rank))}
	for _, f := range with {
		f(rv)
	}
	go func() {
		book, wire, stop, err := rv.exchange(ctx, 1000+uint64(rank))
		out <- rvResult{rank, book, wire, stop, err}
	}()
	return out
}

// listening waits until something accepts connections at root.
func listening(t *testing.T, ctx context.Context, root string) {
	t.Helper()
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "tcp", root)
		if err == nil {
			c.Close()
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("nothing listens at %s: %v", root, err)
		}
		time.Sleep(time.Millisecond) // polling for a listener of another goroutine's
	}
}

// Two jobs given one rendezvous address: the second job's rank 0 cannot serve it and
// says why, the second job's rank 1 is refused at once and says whose the rendezvous is,
// and the first job completes with its own ranks.
func TestRendezvousTwoJobsOneRoot(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	root := testutil.FreeTCPAddr(t)
	a0 := startRank(ctx, "50.0", 0, 2, root, time.Minute)
	listening(t, ctx, root)

	b0 := <-startRank(ctx, "51.0", 0, 2, root, time.Minute)
	if b0.err == nil || !strings.Contains(b0.err.Error(), "another job's rank 0") {
		t.Errorf("job B's rank 0: %v, want it to say the port may be another job's", b0.err)
	}
	b1 := <-startRank(ctx, "51.0", 1, 2, root, time.Minute)
	if !errors.Is(b1.err, ErrRefused) || !strings.Contains(b1.err.Error(), `serves job "50.0", not rank 1's job "51.0"`) {
		t.Errorf("job B's rank 1: %v, want ErrRefused naming both jobs", b1.err)
	}
	a1 := <-startRank(ctx, "50.0", 1, 2, root, time.Minute)
	r0 := <-a0
	for _, r := range []rvResult{r0, a1} {
		if r.err != nil {
			t.Fatalf("job A's rank %d: %v", r.rank, r.err)
		}
		if len(r.book) != 2 || r.book[0].Port() != 40000 || r.book[1].Port() != 40001 || r.wire != 1000 {
			t.Errorf("job A's rank %d: book %v wire %d", r.rank, r.book, r.wire)
		}
	}
	// Job A's rank 0 refuses a late rank until its Close (stop), which frees the port.
	late := <-startRank(ctx, "51.0", 1, 2, root, time.Minute)
	if !errors.Is(late.err, ErrRefused) || !strings.Contains(late.err.Error(), `serves job "50.0", whose 2 ranks have all come`) {
		t.Errorf("a late rank of job B: %v, want ErrRefused", late.err)
	}
	r0.stop()
	b0 = <-startRank(ctx, "51.0", 0, 2, root, time.Minute, func(rv *rendezvous) { rv.expire = closedTimer() })
	if !errors.Is(b0.err, context.DeadlineExceeded) {
		t.Errorf("job B's rank 0 once job A's closed: %v, want it to serve (and time out alone)", b0.err)
	}
}

// closedTimer is a rendezvous timer that has expired.
func closedTimer() <-chan time.Time {
	c := make(chan time.Time)
	close(c)
	return c
}

// Rank 0 refuses, with the reason, a rank of a job of another size, a rank the job does
// not have, and a rank that has reported already; a connection that sends nothing holds
// up nobody.
func TestRendezvousRefuses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	root := testutil.FreeTCPAddr(t)
	r0 := startRank(ctx, "j", 0, 3, root, time.Minute)
	listening(t, ctx, root)
	silent, err := net.Dial("tcp", root)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	for _, c := range []struct {
		rank, size int
		says       string
	}{
		{1, 4, "serves a job of 3 ranks, not rank 1's job of 4"},
		{5, 3, "has no rank 5 in a job of 3 ranks"},
	} {
		r := <-startRank(ctx, "j", c.rank, c.size, root, time.Minute)
		if !errors.Is(r.err, ErrRefused) || !strings.Contains(r.err.Error(), c.says) {
			t.Errorf("rank %d of %d: %v, want ErrRefused saying %q", c.rank, c.size, r.err, c.says)
		}
	}
	// Two ranks 1: whichever reports second is refused, the other completes the job.
	ones := []<-chan rvResult{startRank(ctx, "j", 1, 3, root, time.Minute), startRank(ctx, "j", 1, 3, root, time.Minute)}
	var refused rvResult
	select { // the refused one answers first; the other waits for the address book
	case refused = <-ones[0]:
		ones = ones[1:]
	case refused = <-ones[1]:
		ones = ones[:1]
	}
	if !errors.Is(refused.err, ErrRefused) || !strings.Contains(refused.err.Error(), "has heard from rank 1 already") {
		t.Errorf("the second rank 1: %v, want ErrRefused", refused.err)
	}
	for _, r := range []rvResult{<-startRank(ctx, "j", 2, 3, root, time.Minute), <-ones[0], <-r0} {
		if r.err != nil || len(r.book) != 3 {
			t.Errorf("rank %d: book %v, %v", r.rank, r.book, r.err)
		}
		r.stop()
	}
}

// A rank whose rank 0 never comes fails within the rendezvous timeout, saying so; a
// rank 0 some of whose ranks never come fails naming them, and tells the ranks that came.
func TestRendezvousTimeout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := <-startRank(ctx, "j", 1, 2, testutil.FreeTCPAddr(t), 50*time.Millisecond)
	if !errors.Is(r.err, context.DeadlineExceeded) || !strings.Contains(r.err.Error(), "did not answer") {
		t.Errorf("rank 1 without a rank 0: %v", r.err)
	}

	root := testutil.FreeTCPAddr(t)
	// Rank 0's time runs out after rank 5 has reported (its timer is the test's), and
	// rank 5 learns from rank 0 which ranks never came.
	expire, arrived := make(chan time.Time), make(chan int, 1)
	r0 := startRank(ctx, "j", 0, 7, root, 300*time.Millisecond, func(rv *rendezvous) {
		rv.expire, rv.arrived = expire, func(r int) { arrived <- r }
	})
	r5 := startRank(ctx, "j", 5, 7, root, time.Minute)
	<-arrived
	close(expire)
	if got := <-r0; !errors.Is(got.err, context.DeadlineExceeded) || !strings.Contains(got.err.Error(), "ranks 1-4, 6 of 7 never reported within 300ms") {
		t.Errorf("rank 0: %v", got.err)
	}
	if got := <-r5; got.err == nil || !strings.Contains(got.err.Error(), "the rendezvous failed: rank 0 at "+root+": ranks 1-4, 6 of 7 never reported") {
		t.Errorf("rank 5: %v", got.err)
	}

	// The caller's context ends first: its error, and still the missing ranks.
	cctx, ccancel := context.WithCancel(ctx)
	root = testutil.FreeTCPAddr(t)
	r0 = startRank(cctx, "j", 0, 2, root, time.Minute)
	listening(t, ctx, root)
	ccancel()
	if got := <-r0; !errors.Is(got.err, context.Canceled) || !strings.Contains(got.err.Error(), "rank 1 of 2 had not reported") {
		t.Errorf("rank 0 cancelled: %v", got.err)
	}
}

func TestRankList(t *testing.T) {
	for _, c := range []struct {
		in   []int
		want string
	}{
		{[]int{2}, "rank 2"},
		{[]int{1, 2}, "ranks 1-2"},
		{[]int{1, 3, 4, 5, 9}, "ranks 1, 3-5, 9"},
	} {
		if got := rankList(c.in); got != c.want {
			t.Errorf("rankList(%v) = %q, want %q", c.in, got, c.want)
		}
	}
}

// A connection that sends a megabyte that is no report (read only to its bound) holds up
// nobody: the rendezvous goes on.
func TestRendezvousLongReport(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	root := testutil.FreeTCPAddr(t)
	r0 := startRank(ctx, "j", 0, 2, root, time.Minute)
	listening(t, ctx, root)
	c, err := net.Dial("tcp", root)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	go c.Write([]byte(`{"job":"` + strings.Repeat("x", 1<<20) + `"}`)) // blocks once rank 0 stops reading
	r1 := <-startRank(ctx, "j", 1, 2, root, time.Minute)
	got := <-r0
	if got.err != nil || r1.err != nil {
		t.Fatalf("rank 0: %v; rank 1: %v", got.err, r1.err)
	}
	got.stop()
}

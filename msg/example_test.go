package msg_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/softrnic/softrnic/msg"
)

// A job of two ranks. Under a launcher (rmsgrun, mpirun, srun) each rank is a process of
// its own and calls msg.Init(ctx, msg.Config{}), which takes the rank, the job's size and
// rank 0's rendezvous address from the environment. Here both ranks run in this process,
// so the example gives them those itself.
//
// Rank 0 sends a small message (eager, in the first phase's slots), a message of 5,000
// bytes (too large for the 1 KiB slots: the connection toward rank 1 is enlarged to
// 16 KiB slots first), and one of 200,000 bytes (above the largest phase: rendezvous,
// written straight into rank 1's receive buffer); then both ranks sum their rank numbers
// and meet at a barrier before they close.
func Example() {
	l, err := net.Listen("tcp", "127.0.0.1:0") // a free port for rank 0's rendezvous
	if err != nil {
		fmt.Println(err)
		return
	}
	root := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	report := make([]string, 2)
	var wg sync.WaitGroup
	for rank := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			report[rank] = runRank(ctx, msg.Config{Rank: rank, Size: 2, Root: root})
		}()
	}
	wg.Wait()
	fmt.Println(report[0])
	fmt.Println(report[1])
	// Output:
	// rank 0: sent 3 messages; 1 enlargement, 1 rendezvous send; sum of ranks 1
	// rank 1: "hello" from rank 0 (tag 7), then 5000 and 200000 bytes intact; ring from rank 0 in phase 1; sum of ranks 1
}

// runRank is what each rank's program does; it returns what the rank reports.
func runRank(ctx context.Context, cfg msg.Config) string {
	c, err := msg.Init(ctx, cfg)
	if err != nil {
		return err.Error()
	}
	defer c.Close()
	medium, large := bytes.Repeat([]byte{'m'}, 5000), bytes.Repeat([]byte{'l'}, 200000)
	var report string
	switch c.Rank() {
	case 0:
		if err := c.Send(ctx, []byte("hello"), 1, 7); err != nil {
			return err.Error()
		}
		if err := c.Send(ctx, medium, 1, 8); err != nil {
			return err.Error()
		}
		r := c.Isend(large, 1, 9) // large must not change until r is done
		if _, err := r.Wait(ctx); err != nil {
			return err.Error()
		}
		s := c.Stats()
		report = fmt.Sprintf("rank 0: sent 3 messages; %d enlargement, %d rendezvous send", s.Enlargements, s.RendezvousSent)
	case 1:
		buf := make([]byte, 64)
		st, err := c.Recv(ctx, buf, msg.AnySource, msg.AnyTag)
		if err != nil {
			return err.Error()
		}
		report = fmt.Sprintf("rank 1: %q from rank %d (tag %d)", buf[:st.Count], st.Source, st.Tag)
		got := make([]byte, len(large))
		if st, err = c.Recv(ctx, got, 0, 8); err != nil || !bytes.Equal(got[:st.Count], medium) {
			return fmt.Sprintf("rank 1: the 5000-byte message: %v", err)
		}
		if st, err = c.Recv(ctx, got, 0, 9); err != nil || !bytes.Equal(got[:st.Count], large) {
			return fmt.Sprintf("rank 1: the 200000-byte message: %v", err)
		}
		report += fmt.Sprintf(", then 5000 and 200000 bytes intact; ring from rank 0 in phase %d", c.Memory().Peers[0].RecvPhase)
	}
	sum := make([]int64, 1)
	if err := msg.Allreduce(ctx, c, []int64{int64(c.Rank())}, sum, msg.Sum); err != nil {
		return err.Error()
	}
	if err := c.Barrier(ctx); err != nil { // no rank closes while another still talks to it
		return err.Error()
	}
	return fmt.Sprintf("%s; sum of ranks %d", report, sum[0])
}

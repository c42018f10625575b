package msg

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/softrnic/softrnic/verbs"
)

// newJob starts n ranks in this process (each with its own device, all talking over the
// wire) and closes them when the test ends.
func newJob(t testing.TB, n int, cfg Config) []*Comm {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	root := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	comms := make([]*Comm, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := 0; r < n; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := cfg
			c.Rank, c.Size, c.Root = r, n, root
			if c.Device.Faults == nil {
				c.Device.Faults = &verbs.Faults{}
			}
			comms[r], errs[r] = Init(ctx, c)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for _, c := range comms {
			c.Close()
		}
	})
	return comms
}

// each runs f for every rank concurrently and fails the test on the first error.
func each(t *testing.T, comms []*Comm, f func(c *Comm) error) {
	t.Helper()
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for i, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(c)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			for _, c := range comms {
				t.Log(c.debugState())
			}
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

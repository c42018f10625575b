package msg

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/verbs"
)

// sendAll sends messages of sizes from rank `from` to rank `to`, message i with tag i,
// and checks they arrive in order. They are started together, under the progress lock,
// so that they are one send vector whatever the scheduler does (Isend by Isend, the first
// could leave before the next is queued once the connection is up).
func sendAll(t *testing.T, comms []*Comm, from, to int, sizes []int) {
	t.Helper()
	var reqs []*Request
	c := comms[from]
	c.pmu.Lock()
	for i, n := range sizes {
		r := &Request{c: c, send: true, buf: testutil.Pattern(n, uint64(i)), peer: to, tag: i}
		c.startSend(r)
		reqs = append(reqs, r)
	}
	c.pump()
	c.pmu.Unlock()
	for i, n := range sizes {
		got := make([]byte, n)
		if _, err := comms[to].Recv(testutil.Context(t), got, from, i); err != nil {
			t.Fatalf("message %d (%d bytes): %v", i, n, err)
		}
		if !bytes.Equal(got, testutil.Pattern(n, uint64(i))) {
			t.Fatalf("message %d (%d bytes): wrong data", i, n)
		}
	}
	for _, r := range reqs {
		if _, err := r.Wait(testutil.Context(t)); err != nil {
			t.Fatal(err)
		}
	}
}

// The first element over the threshold switches the connection to larger slots: the
// sender reports 0 bytes while it waits, the receiver enlarges only this connection.
func TestEnlargeFirstElement(t *testing.T) {
	comms := newJob(t, 3, Config{})
	sendAll(t, comms, 0, 2, []int{100}) // rank 2 has connections to 0 and (below) 1
	sendAll(t, comms, 1, 2, []int{100})
	sendAll(t, comms, 0, 2, []int{5000, 100})
	s, lab := comms[0].Stats(), comms[0].LabStats()
	if s.Enlargements != 1 || lab.ZeroByteReports == 0 || lab.PrefixSends != 0 {
		t.Errorf("sender: %d enlargements, %d zero-byte reports, %d prefixes; want 1, >0, 0", s.Enlargements, lab.ZeroByteReports, lab.PrefixSends)
	}
	// The steps are timed where each role saw them, and follow one another: the sender's
	// first large post comes after the acknowledgement was read and its own provisioning.
	if e := lab.LastEnlargement; e.AckWait <= 0 || e.Provision <= 0 || e.ToFirstSend < e.AckWait+e.Provision || e.Serve != 0 || e.AckPost != 0 {
		t.Errorf("sender's enlargement times %+v: want AckWait, Provision > 0, ToFirstSend >= their sum, no receiver's times", e)
	}
	if e := comms[2].LabStats().LastEnlargement; e.Serve <= 0 || e.AckPost <= 0 || e.AckWait != 0 {
		t.Errorf("receiver's enlargement times %+v: want Serve, AckPost > 0 and no sender's times", e)
	}
	m := comms[2].Memory()
	for _, p := range m.Peers {
		want := map[int]int{0: 1, 1: 0}[p.Rank] // only rank 0's connection grew
		if p.RecvPhase != want {
			t.Errorf("rank 2's ring from rank %d in phase %d, want %d", p.Rank, p.RecvPhase, want)
		}
	}
}

// A later element over the threshold: the prefix that fits goes first, the rest after
// the enlargement.
func TestEnlargeLaterElement(t *testing.T) {
	comms := newJob(t, 2, Config{})
	sendAll(t, comms, 0, 1, []int{10, 200, 900, 8000, 50})
	if s, lab := comms[0].Stats(), comms[0].LabStats(); lab.PrefixSends != 1 || s.Enlargements != 1 {
		t.Errorf("%d prefix sends, %d enlargements; want 1 and 1", lab.PrefixSends, s.Enlargements)
	}
}

// Three phases, and each connection's registered memory follows its phase.
func TestThreePhases(t *testing.T) {
	comms := newJob(t, 2, Config{})
	sendAll(t, comms, 0, 1, []int{500})
	small := comms[1].Memory()
	sendAll(t, comms, 0, 1, []int{5000})
	sendAll(t, comms, 0, 1, []int{100000})
	large := comms[1].Memory()
	if s := comms[0].Stats(); s.Enlargements != 2 {
		t.Errorf("%d enlargements, want 2 (1 KiB -> 16 KiB -> 128 KiB)", s.Enlargements)
	}
	if small.Registered > 16<<10 {
		t.Errorf("a small connection holds %d bytes registered, more than 16 KiB", small.Registered)
	}
	if p := large.Peers[0]; p.RecvPhase != 2 || p.RecvRing != 8*128<<10 {
		t.Errorf("after two enlargements: %+v", p)
	}
	t.Logf("registered per connection: %d bytes small, %d after enlargement", small.Registered, large.Registered)
}

// Both directions enlarge at once while another connection carries small traffic.
func TestEnlargeBothWaysWithTraffic(t *testing.T) {
	for _, ord := range []verbs.Ordering{verbs.OrderingOrdered, verbs.OrderingWeak} {
		t.Run(ord.String(), func(t *testing.T) {
			comms := newJob(t, 3, Config{Ordering: ord})
			each(t, comms, func(c *Comm) error {
				ctx := testutil.Context(t)
				switch c.Rank() {
				case 0, 1:
					peer := 1 - c.Rank()
					var reqs []*Request
					for i, n := range []int{100, 3000, 20000, 200, 60000} {
						reqs = append(reqs, c.Isend(testutil.Pattern(n, uint64(i+c.Rank())), peer, i))
					}
					for i := 0; i < 50; i++ {
						reqs = append(reqs, c.Isend(testutil.Pattern(64, uint64(i)), 2, 100+i))
					}
					for i, n := range []int{100, 3000, 20000, 200, 60000} {
						got := make([]byte, n)
						if _, err := c.Recv(ctx, got, peer, i); err != nil {
							return err
						}
						if !bytes.Equal(got, testutil.Pattern(n, uint64(i+peer))) {
							return fmt.Errorf("message %d: wrong data", i)
						}
					}
					for _, r := range reqs {
						if _, err := r.Wait(ctx); err != nil {
							return err
						}
					}
				case 2:
					got := make([]byte, 64)
					for from := 0; from < 2; from++ {
						for i := 0; i < 50; i++ {
							if _, err := c.Recv(ctx, got, from, 100+i); err != nil {
								return err
							}
							if !bytes.Equal(got, testutil.Pattern(64, uint64(i))) {
								return fmt.Errorf("small message %d from %d: wrong data", i, from)
							}
						}
					}
				}
				return nil
			})
		})
	}
}

// Under packet loss, duplication and reordering, enlargement and rendezvous still
// deliver every byte (the RC transport recovers; the layer must not care).
func TestEnlargeUnderFaults(t *testing.T) {
	comms := newJob(t, 2, Config{Device: verbs.DeviceConfig{Faults: &verbs.Faults{Loss: 0.03, Dup: 0.02, Reorder: 0.03, Seed: 3}}})
	sendAll(t, comms, 0, 1, []int{10, 700, 4000, 30000, 200000, 10})
	sendAll(t, comms, 1, 0, []int{20000, 5})
}

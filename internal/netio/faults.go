package netio

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Faults are probabilities applied independently to each outgoing datagram.
type Faults struct {
	Loss    float64 // drop the datagram
	Reorder float64 // hold it back and send it after later datagrams
	Dup     float64 // send it twice
	Corrupt float64 // flip one bit (the receiver's ICRC check must catch it)
	Seed    uint64  // PRNG seed; the same seed and traffic give the same faults
}

// Active reports whether any fault has a non-zero probability.
func (f Faults) Active() bool { return f.Loss > 0 || f.Reorder > 0 || f.Dup > 0 || f.Corrupt > 0 }

// String formats f in the SOFTRNIC_FAULTS syntax.
func (f Faults) String() string {
	return fmt.Sprintf("loss=%g,reorder=%g,dup=%g,corrupt=%g,seed=%d", f.Loss, f.Reorder, f.Dup, f.Corrupt, f.Seed)
}

// ParseFaults parses "loss=0.01,reorder=0.02,dup=0.005,corrupt=0.001,seed=7". Missing
// keys are zero; an empty string means no faults.
func ParseFaults(s string) (Faults, error) {
	var f Faults
	s = strings.TrimSpace(s)
	if s == "" {
		return f, nil
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			return Faults{}, fmt.Errorf("netio: fault %q: want key=value", kv)
		}
		if k == "seed" {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return Faults{}, fmt.Errorf("netio: fault seed %q: %v", v, err)
			}
			f.Seed = n
			continue
		}
		p, err := strconv.ParseFloat(v, 64)
		if err != nil || p < 0 || p > 1 {
			return Faults{}, fmt.Errorf("netio: fault %s=%q: want a probability in [0,1]", k, v)
		}
		switch k {
		case "loss":
			f.Loss = p
		case "reorder":
			f.Reorder = p
		case "dup":
			f.Dup = p
		case "corrupt":
			f.Corrupt = p
		default:
			return Faults{}, fmt.Errorf("netio: unknown fault %q (want loss, reorder, dup, corrupt, seed)", k)
		}
	}
	return f, nil
}

// Action is what a FilterFunc decides for one datagram.
type Action int

// Actions.
const (
	Pass      Action = iota // send unchanged (random faults still apply)
	Drop                    // lose it
	Duplicate               // send it twice
	Corrupt                 // flip one bit
	Delay                   // hold it until Verdict.After more datagrams were sent (or 1 ms)
	Deliver                 // send unchanged and skip the random faults
)

// Verdict is a FilterFunc's decision.
type Verdict struct {
	Action Action
	After  int // for Delay: how many later datagrams go first (at least 1)
}

// FilterFunc decides the fate of one outgoing datagram; pkt is a copy it may keep.
type FilterFunc func(pkt []byte) Verdict

// FaultCounters count what the injector did.
type FaultCounters struct {
	Lost, Reordered, Duplicated, Corrupted uint64
}

const maxHold = time.Millisecond

type held struct {
	pkt   []byte
	dst   *Addr
	src   uint8
	after int
	at    time.Time
}

// injector applies faults to outgoing datagrams. Datagrams it leaves alone go out as they
// are, payload not copied and GSO grouping kept, so a fault rate costs only the faults;
// only delayed and corrupted datagrams are copied.
type injector struct {
	f      Faults
	filter FilterFunc
	c      *Conn

	mu    sync.Mutex
	rng   *rand.Rand
	held  []held
	out   *SendBatch // what goes out: pieces of the caller's datagrams, or copies
	keep  [][]byte   // copies out refers to
	spare [][]byte   // copy buffers free for reuse
	due   []held     // scratch for releaseDue
	done  chan struct{}
	once  sync.Once

	lost, reordered, duplicated, corrupted atomic.Uint64
}

func newInjector(f Faults, filter FilterFunc, c *Conn) *injector {
	inj := &injector{f: f, filter: filter, c: c, rng: rand.New(rand.NewPCG(f.Seed, f.Seed^0x9e3779b97f4a7c15)), done: make(chan struct{})}
	go inj.releaser()
	return inj
}

// SetFilter replaces the exact-fault filter. It only works on a Conn opened with fault
// injection (faults or a filter); it reports whether it did.
func (c *Conn) SetFilter(f FilterFunc) bool {
	if c.faults == nil {
		return false
	}
	c.faults.mu.Lock()
	c.faults.filter = f
	c.faults.mu.Unlock()
	return true
}

func (inj *injector) counters() FaultCounters {
	return FaultCounters{inj.lost.Load(), inj.reordered.Load(), inj.duplicated.Load(), inj.corrupted.Load()}
}

func (inj *injector) stop() { inj.once.Do(func() { close(inj.done) }) }

// reset prepares inj.out for up to n datagrams of up to iovs pieces in all.
func (inj *injector) reset(n, iovs int) {
	if inj.out == nil || cap(inj.out.pkts) < n || cap(inj.out.iovs) < iovs {
		inj.out = NewSendBatch(n, iovs, 64)
	}
	inj.out.Reset()
	// The kernel copied what was sent: the copies' buffers can be used again.
	for _, k := range inj.keep {
		if cap(k) > 0 {
			inj.spare = append(inj.spare, k[:0])
		}
	}
	clear(inj.keep)
	inj.keep = inj.keep[:0]
}

// releaser sends datagrams held longer than maxHold, so a held datagram is not stuck when
// no later traffic comes.
func (inj *injector) releaser() {
	t := time.NewTicker(maxHold / 2)
	defer t.Stop()
	for {
		select {
		case <-inj.done:
			return
		case now := <-t.C:
			inj.mu.Lock()
			inj.reset(len(inj.held)+1, len(inj.held)+1)
			kept := inj.held[:0]
			for _, h := range inj.held {
				if now.Sub(h.at) >= maxHold {
					inj.emitCopy(h.pkt, h.dst, h.src)
				} else {
					kept = append(kept, h)
				}
			}
			inj.held = kept
			_ = inj.c.send(inj.out)
			inj.reset(0, 0)
			inj.mu.Unlock()
		}
	}
}

// send applies faults to every datagram of b and sends the result.
func (inj *injector) send(b *SendBatch) error {
	inj.mu.Lock()
	defer inj.mu.Unlock()
	n := len(b.pkts)
	inj.reset(2*n+len(inj.held)+1, 2*len(b.iovs)+len(inj.held)+1)
	for i := range b.pkts {
		dst := b.pkts[i].dst
		v := Verdict{Action: Pass}
		if inj.filter != nil {
			v = inj.filter(b.packet(i, nil))
		}
		if v.Action == Pass {
			v = inj.random()
		}
		switch v.Action {
		case Drop:
			inj.lost.Add(1)
		case Duplicate:
			inj.duplicated.Add(1)
			inj.pass(b, i)
			inj.pass(b, i)
		case Corrupt:
			inj.corrupted.Add(1)
			pkt := b.packet(i, inj.buffer())
			inj.flip(pkt)
			inj.emitCopy(pkt, dst, b.pkts[i].src)
		case Delay:
			inj.reordered.Add(1)
			if v.After < 1 {
				v.After = 1
			}
			inj.held = append(inj.held, held{pkt: b.packet(i, inj.buffer()), dst: dst, src: b.pkts[i].src, after: v.After, at: time.Now()})
		default:
			inj.pass(b, i)
		}
	}
	err := inj.c.send(inj.out)
	inj.reset(0, 0)
	return err
}

func (inj *injector) random() Verdict {
	f := &inj.f
	r := inj.rng.Float64
	switch {
	case f.Loss > 0 && r() < f.Loss:
		return Verdict{Action: Drop}
	case f.Corrupt > 0 && r() < f.Corrupt:
		return Verdict{Action: Corrupt}
	case f.Dup > 0 && r() < f.Dup:
		return Verdict{Action: Duplicate}
	case f.Reorder > 0 && r() < f.Reorder:
		return Verdict{Action: Delay, After: 1 + inj.rng.IntN(3)}
	}
	return Verdict{Action: Pass}
}

// flip flips one random bit outside byte 4 of the BTH, which the ICRC does not cover.
func (inj *injector) flip(pkt []byte) {
	if len(pkt) == 0 {
		return
	}
	for {
		bit := inj.rng.IntN(len(pkt) * 8)
		if bit/8 == 4 && len(pkt) > 5 {
			continue
		}
		pkt[bit/8] ^= 1 << (bit % 8)
		return
	}
}

// pass queues datagram i of b unchanged (its pieces, not a copy).
func (inj *injector) pass(b *SendBatch, i int) {
	p := &b.pkts[i]
	inj.out.BeginFrom(p.dst, int(p.src))
	for _, v := range b.iovs[p.iov0:p.iov1] {
		inj.out.addIov(v)
	}
	inj.out.End()
	inj.releaseDue()
}

// buffer returns a buffer for a copy of a datagram, reused once the copy was sent.
func (inj *injector) buffer() []byte {
	if n := len(inj.spare); n > 0 {
		b := inj.spare[n-1]
		inj.spare[n-1] = nil
		inj.spare = inj.spare[:n-1]
		return b
	}
	return nil
}

// emitCopy queues a copied datagram.
func (inj *injector) emitCopy(pkt []byte, dst *Addr, src uint8) {
	if len(pkt) == 0 {
		pkt = make([]byte, 0, 1)
	}
	inj.keep = append(inj.keep, pkt)
	inj.out.BeginFrom(dst, int(src))
	inj.out.Add(pkt)
	inj.out.End()
}

// releaseDue counts one datagram sent past every held one and queues those whose turn has
// come.
func (inj *injector) releaseDue() {
	if len(inj.held) == 0 {
		return
	}
	kept := inj.held[:0]
	due := inj.due[:0]
	for _, h := range inj.held {
		if h.after--; h.after <= 0 {
			due = append(due, h)
		} else {
			kept = append(kept, h)
		}
	}
	clear(inj.held[len(kept):])
	inj.held = kept
	inj.due = due
	for _, h := range due {
		inj.emitCopy(h.pkt, h.dst, h.src)
	}
}

package msg

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// AnySource and AnyTag match any sender or tag in Recv, Irecv and Probe.
const (
	AnySource = -1
	AnyTag    = -1
)

// Errors; test with errors.Is.
var (
	// ErrTruncated: the message was longer than the receive buffer (MPI_ERR_TRUNCATE);
	// the buffer holds its first bytes and Status.Count says how long it was.
	ErrTruncated = errors.New("msg: message truncated")
	// ErrPeerGone: the peer rank died or its connection failed.
	ErrPeerGone = errors.New("msg: peer rank gone")
	// ErrClosed: the communicator was closed.
	ErrClosed = errors.New("msg: closed")
)

// Status describes a received (or probed) message.
type Status struct {
	Source, Tag int
	Count       int // the message's length in bytes
}

// Request is a non-blocking operation (MPI_Request).
type Request struct {
	c      *Comm
	done   atomic.Bool   // set under the progress lock, with status and err
	sig    chan struct{} // made by the first Wait that sleeps (kept by a pooled request), signalled when done (progress lock)
	status Status
	err    error

	send     bool
	buf      []byte
	peer     int // send: destination; receive: source (or AnySource)
	tag      int
	ctx      uint8
	started  bool   // a send taken off its queue, a receive matched
	id       uint64 // rendezvous send: the message ID
	pinned   *regEntry
	rndvFrom int // rendezvous receive: the sender
	rndvID   uint64
	rndvAddr uint64 // rendezvous send: where the receiver wants it (CTS)
	rndvKey  uint32
	rndvLen  int
}

// Wait waits for the request and returns its status. If ctx ends first, a receive not
// yet matched or a send not yet started is cancelled and Wait returns ctx.Err(); one
// already under way is waited for (it ends with the peer's answer or its death).
func (r *Request) Wait(ctx context.Context) (Status, error) {
	if !r.c.await(ctx, r) {
		r.c.pmu.Lock()
		r.c.cancel(r, ctx.Err())
		r.c.pmu.Unlock()
		r.c.await(context.Background(), r)
	}
	return r.status, r.err
}

// Test reports whether the request is done, and then its status and error.
func (r *Request) Test() (Status, bool, error) {
	if !r.done.Load() && r.c.pmu.TryLock() { // progress, as MPI_Test does
		if !r.c.down {
			r.c.round()
		}
		r.c.pmu.Unlock()
	}
	if !r.done.Load() {
		return Status{}, false, nil
	}
	return r.status, true, r.err
}

// finished and signal make a Request something await can wait for.
func (r *Request) finished() bool { return r.done.Load() }

func (r *Request) signal() <-chan struct{} {
	if r.sig == nil {
		r.sig = make(chan struct{}, 1)
	}
	return r.sig
}

// complete ends the request (progress lock held).
func (r *Request) complete(err error) {
	if r.done.Load() {
		return
	}
	r.err = err
	sig := r.sig
	r.done.Store(true) // from here on the request may be released and reused: no more access
	if sig != nil {
		select {
		case sig <- struct{}{}: // one sleeper at most: MPI waits for a request once
		default:
		}
	}
}

// reqPool holds the requests of the blocking Send and Recv, which no caller sees.
var reqPool = sync.Pool{New: func() any { return new(Request) }}

// release gives a request of Send or Recv back: it is done, and nothing refers to it. Its
// wake channel stays with it (emptied), so that a Wait that sleeps allocates nothing.
func (r *Request) release() {
	sig := r.sig
	if sig != nil {
		select {
		case <-sig:
		default:
		}
	}
	*r = Request{sig: sig}
	reqPool.Put(r)
}

func errPeer(rank int, err error) error {
	return fmt.Errorf("%w: rank %d: %w", ErrPeerGone, rank, err)
}

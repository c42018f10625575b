package msg

import (
	"context"
	"fmt"
	"unsafe"
)

// Collectives, built on the point-to-point layer with log2(N) rounds: Barrier by
// dissemination, Bcast down a binomial tree, Allreduce by recursive doubling (reduce up a
// binomial tree and Bcast when N is not a power of two), Allgather by a binomial gather
// and a Bcast. Their messages travel in a context of their own, so they never match a
// user's receive; every rank must call the same collectives in the same order, one at a
// time (as MPI requires).

// Number is the element type of collectives' slices.
type Number interface {
	~int8 | ~int16 | ~int32 | ~int64 | ~int | ~uint8 | ~uint16 | ~uint32 | ~uint64 | ~uint | ~float32 | ~float64
}

// Op is a reduction.
type Op int

// Reductions.
const (
	Sum Op = iota
	Min
	Max
)

const collCtx = 1

func asBytes[T Number](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(z)))
}

// collTag returns the first tag of the next collective (64 per collective).
func (c *Comm) collTag() int {
	t := (c.collSeq % (1 << 24)) * 64
	c.collSeq++
	return t
}

// sendrecv exchanges with two peers in the collectives' context.
func (c *Comm) sendrecv(ctx context.Context, send []byte, to int, recv []byte, from int, tag int) error {
	var s *Request
	if to >= 0 {
		s = c.isend(send, to, tag, collCtx)
	}
	if from >= 0 {
		if _, err := c.irecv(recv, from, tag, collCtx).Wait(ctx); err != nil {
			return err
		}
	}
	if s != nil {
		if _, err := s.Wait(ctx); err != nil {
			return err
		}
	}
	return nil
}

// Barrier returns once every rank called it (MPI_Barrier).
func (c *Comm) Barrier(ctx context.Context) error {
	tag := c.collTag()
	n, r := c.size, c.rank
	for k, round := 1, 0; k < n; k, round = k*2, round+1 {
		if err := c.sendrecv(ctx, nil, (r+k)%n, nil, (r-k+n)%n, tag+round); err != nil {
			return callError("Barrier", err)
		}
	}
	return nil
}

// Bcast copies root's buf into every rank's buf (MPI_Bcast); every rank passes a
// slice of the same length.
func Bcast[T Number](ctx context.Context, c *Comm, buf []T, root int) error {
	if root < 0 || root >= c.size {
		return noRank("Bcast from root", root, c.size)
	}
	if err := c.bcast(ctx, asBytes(buf), root, c.collTag()); err != nil {
		return callError("Bcast", err)
	}
	return nil
}

func (c *Comm) bcast(ctx context.Context, b []byte, root, tag int) error {
	n := c.size
	vr := (c.rank - root + n) % n
	mask := 1
	for ; mask < n; mask <<= 1 {
		if vr&mask != 0 {
			if _, err := c.irecv(b, (vr-mask+root)%n, tag, collCtx).Wait(ctx); err != nil {
				return err
			}
			break
		}
	}
	var sends []*Request
	for mask >>= 1; mask > 0; mask >>= 1 {
		if vr+mask < n {
			sends = append(sends, c.isend(b, (vr+mask+root)%n, tag, collCtx))
		}
	}
	for _, s := range sends {
		if _, err := s.Wait(ctx); err != nil {
			return err
		}
	}
	return nil
}

func reduce[T Number](acc, in []T, op Op) {
	for i, v := range in {
		switch op {
		case Sum:
			acc[i] += v
		case Min:
			acc[i] = min(acc[i], v)
		case Max:
			acc[i] = max(acc[i], v)
		}
	}
}

// Allreduce combines every rank's send element-wise with op into every rank's recv
// (MPI_Allreduce); send and recv have the same length on every rank and may be the
// same slice. Every rank gets the same bits: the combination order does not depend on
// the rank.
func Allreduce[T Number](ctx context.Context, c *Comm, send, recv []T, op Op) error {
	if len(recv) != len(send) {
		return fmt.Errorf("msg: Allreduce: %w: send has %d elements, recv %d", ErrInvalid, len(send), len(recv))
	}
	if op < Sum || op > Max {
		return fmt.Errorf("msg: Allreduce: %w: unknown %v", ErrInvalid, op)
	}
	copy(recv, send)
	tag := c.collTag()
	n, r := c.size, c.rank
	tmp := make([]T, len(send))
	if n&(n-1) == 0 {
		// Recursive doubling: partners exchange what they have; the lower rank's part
		// goes first, so every rank adds in the same order.
		for mask, round := 1, 0; mask < n; mask, round = mask<<1, round+1 {
			partner := r ^ mask
			if err := c.sendrecv(ctx, asBytes(recv), partner, asBytes(tmp), partner, tag+round); err != nil {
				return callError("Allreduce", err)
			}
			if partner < r {
				reduce(tmp, recv, op)
				copy(recv, tmp)
			} else {
				reduce(recv, tmp, op)
			}
		}
		return nil
	}
	// Reduce up a binomial tree to rank 0, then Bcast.
	for mask, round := 1, 0; mask < n; mask, round = mask<<1, round+1 {
		if r&mask != 0 {
			if err := c.sendrecv(ctx, asBytes(recv), r&^mask, nil, -1, tag+round); err != nil {
				return callError("Allreduce", err)
			}
			break
		}
		if src := r | mask; src < n {
			if err := c.sendrecv(ctx, nil, -1, asBytes(tmp), src, tag+round); err != nil {
				return callError("Allreduce", err)
			}
			reduce(recv, tmp, op)
		}
	}
	if err := c.bcast(ctx, asBytes(recv), 0, tag+63); err != nil {
		return callError("Allreduce", err)
	}
	return nil
}

// Allgather puts every rank's send, in rank order, into every rank's recv
// (MPI_Allgather): len(recv) = Size() × len(send), the same on every rank.
func Allgather[T Number](ctx context.Context, c *Comm, send, recv []T) error {
	k := len(send)
	if len(recv) != k*c.size {
		return fmt.Errorf("msg: Allgather: %w: recv has %d elements, want %d × %d", ErrInvalid, len(recv), c.size, k)
	}
	copy(recv[c.rank*k:], send)
	tag := c.collTag()
	n, r := c.size, c.rank
	// Binomial gather to rank 0: rank r holds ranks [r, r+have) after each round.
	have := 1
	for mask, round := 1, 0; mask < n; mask, round = mask<<1, round+1 {
		if r&mask != 0 {
			if err := c.sendrecv(ctx, asBytes(recv[r*k:(r+have)*k]), r&^mask, nil, -1, tag+round); err != nil {
				return callError("Allgather", err)
			}
			break
		}
		if src := r | mask; src < n {
			m := min(mask, n-src)
			if err := c.sendrecv(ctx, nil, -1, asBytes(recv[src*k:(src+m)*k]), src, tag+round); err != nil {
				return callError("Allgather", err)
			}
			have += m
		}
	}
	if err := c.bcast(ctx, asBytes(recv), 0, tag+63); err != nil {
		return callError("Allgather", err)
	}
	return nil
}

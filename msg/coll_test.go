package msg

import (
	"fmt"
	"slices"
	"testing"

	"github.com/softrnic/softrnic/internal/testutil"
)

// Collectives against a sequential reference, for a power of two and not.
func TestCollectives(t *testing.T) {
	for _, n := range []int{1, 4, 5} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			comms := newJob(t, n, Config{})
			const k = 300 // 2.4 KB of int64: the second phase
			in := func(r int) []int64 {
				v := make([]int64, k)
				for i := range v {
					v[i] = int64((r*7919+i*104729)%1000 - 500)
				}
				return v
			}
			want := map[Op][]int64{}
			for _, op := range []Op{Sum, Min, Max} {
				acc := slices.Clone(in(0))
				for r := 1; r < n; r++ {
					reduce(acc, in(r), op)
				}
				want[op] = acc
			}
			var gathered []float64
			for r := 0; r < n; r++ {
				gathered = append(gathered, float64(r), float64(r)+0.5)
			}
			each(t, comms, func(c *Comm) error {
				ctx := testutil.Context(t)
				if err := c.Barrier(ctx); err != nil {
					return err
				}
				for _, op := range []Op{Sum, Min, Max} {
					out := make([]int64, k)
					if err := Allreduce(ctx, c, in(c.Rank()), out, op); err != nil {
						return err
					}
					if !slices.Equal(out, want[op]) {
						return fmt.Errorf("Allreduce op %d differs from the sequential reference", op)
					}
				}
				b := make([]int32, 5000)
				if c.Rank() == n-1 {
					for i := range b {
						b[i] = int32(i * 3)
					}
				}
				if err := Bcast(ctx, c, b, n-1); err != nil {
					return err
				}
				for i := range b {
					if b[i] != int32(i*3) {
						return fmt.Errorf("Bcast: element %d is %d", i, b[i])
					}
				}
				g := make([]float64, 2*n)
				if err := Allgather(ctx, c, []float64{float64(c.Rank()), float64(c.Rank()) + 0.5}, g); err != nil {
					return err
				}
				if !slices.Equal(g, gathered) {
					return fmt.Errorf("Allgather: %v", g)
				}
				return c.Barrier(ctx)
			})
		})
	}
}

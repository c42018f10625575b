package msg

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"time"
)

// ErrNoLauncher is FromEnv's error when the environment names no launcher's rank and
// size. Init then starts a job of one rank.
var ErrNoLauncher = errors.New("msg: no launcher environment (OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID)")

// launcherVars are the rank and size variables of the launchers FromEnv knows: Open
// MPI's mpirun, PMI (rmsgrun), Slurm's srun.
var launcherVars = [][2]string{{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}, {"PMI_RANK", "PMI_SIZE"}, {"SLURM_PROCID", "SLURM_NTASKS"}}

// FromEnv fills Rank, Size and Root from a launcher's environment: Open MPI's mpirun
// (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE), Slurm's srun (SLURM_PROCID,
// SLURM_NTASKS), PMI (PMI_RANK, PMI_SIZE, as rmsgrun sets); the rendezvous address from
// SOFTRNIC_ROOT (host:port, like torch.distributed's MASTER_ADDR) and the device address
// from SOFTRNIC_ADDR. It fails with ErrNoLauncher if no launcher's variables are set,
// and with an error naming the variable if a rank is set without its size.
func FromEnv(c *Config) error {
	for _, v := range launcherVars {
		rs, ss := os.Getenv(v[0]), os.Getenv(v[1])
		if rs != "" && ss == "" {
			return fmt.Errorf("msg: %w: %s=%q is set but %s is not: a launcher sets both", ErrInvalid, v[0], rs, v[1])
		}
		if rs == "" || ss == "" {
			continue // a size alone is an allocation's (a Slurm shell), not a rank's
		}
		r, err1 := strconv.Atoi(rs)
		s, err2 := strconv.Atoi(ss)
		if err1 != nil || err2 != nil || s < 1 || r < 0 || r >= s {
			return fmt.Errorf("msg: %w: %s=%q %s=%q: not a rank and a size", ErrInvalid, v[0], rs, v[1], ss)
		}
		c.Rank, c.Size = r, s
		if c.LocalSize == 0 {
			for _, v := range []string{"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"} {
				if n, err := strconv.Atoi(os.Getenv(v)); err == nil && n > 0 {
					c.LocalSize = n
					break
				}
			}
		}
		if c.Root == "" {
			c.Root = os.Getenv("SOFTRNIC_ROOT")
		}
		if err := addrFromEnv(c); err != nil {
			return err
		}
		if c.Root == "" && s > 1 {
			return fmt.Errorf("msg: SOFTRNIC_ROOT (host:port of rank 0's rendezvous) is not set")
		}
		return nil
	}
	return ErrNoLauncher
}

// addrFromEnv sets c.Addr from SOFTRNIC_ADDR, unless it is set already.
func addrFromEnv(c *Config) error {
	if a := os.Getenv("SOFTRNIC_ADDR"); a != "" && !c.Addr.IsValid() {
		ip, err := netip.ParseAddr(a)
		if err != nil {
			return fmt.Errorf("msg: %w: SOFTRNIC_ADDR=%q: %v", ErrInvalid, a, err)
		}
		c.Addr = ip
	}
	return nil
}

// fromEnvOrAlone fills a Config whose Size is 0: from the launcher's environment, or,
// with no launcher, as the one rank of a job of one (MPI's singleton). A Rank without a
// Size is refused: the program meant to name its place in a larger job.
func fromEnvOrAlone(c *Config) error {
	if c.Rank != 0 {
		return fmt.Errorf("msg: %w: Config.Rank is %d but Size is 0: set both, or neither to take them from the launcher", ErrInvalid, c.Rank)
	}
	err := FromEnv(c)
	if !errors.Is(err, ErrNoLauncher) {
		return err
	}
	c.Rank, c.Size = 0, 1
	return addrFromEnv(c)
}

// bookEntry is one rank's line of the address book.
type bookEntry struct {
	Rank int    `json:"rank"`
	Dev  string `json:"dev"`
	Job  uint64 `json:"job,omitempty"`
}

// exchange gives every rank every rank's device address: rank 0 serves root, the others
// report to it (retrying until rank 0 is up) and get the whole book back. It also agrees
// on a job ID (rank 0's), which connections carry so that ranks of another job are refused.
func exchange(ctx context.Context, rank, size int, root string, dev netip.AddrPort, job uint64) ([]netip.AddrPort, uint64, error) {
	book := make([]netip.AddrPort, size)
	book[rank] = dev
	if size == 1 {
		return book, job, nil
	}
	if rank == 0 {
		var lc net.ListenConfig
		l, err := lc.Listen(ctx, "tcp", root)
		if err != nil {
			return nil, 0, fmt.Errorf("msg: rank 0 serving the rendezvous on %s: %w", root, err)
		}
		defer l.Close()
		stop := context.AfterFunc(ctx, func() { l.Close() })
		defer stop()
		conns := make([]net.Conn, 0, size-1)
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for len(conns) < size-1 {
			c, err := l.Accept()
			if err != nil {
				return nil, 0, fmt.Errorf("msg: rendezvous: %w (%d of %d ranks reported)", err, len(conns)+1, size)
			}
			var e bookEntry
			c.SetDeadline(time.Now().Add(10 * time.Second))
			if err := json.NewDecoder(c).Decode(&e); err != nil || e.Rank <= 0 || e.Rank >= size || book[e.Rank].IsValid() {
				c.Close()
				continue // not one of ours, or a duplicate rank: ignore it
			}
			if book[e.Rank], err = netip.ParseAddrPort(e.Dev); err != nil {
				c.Close()
				continue
			}
			conns = append(conns, c)
		}
		out := make([]bookEntry, size)
		for i, a := range book {
			out[i] = bookEntry{Rank: i, Dev: a.String(), Job: job}
		}
		for _, c := range conns {
			c.SetDeadline(time.Now().Add(10 * time.Second))
			if err := json.NewEncoder(c).Encode(out); err != nil {
				return nil, 0, fmt.Errorf("msg: rendezvous: sending the address book: %w", err)
			}
		}
		return book, job, nil
	}
	var c net.Conn
	var d net.Dialer
	for {
		var err error
		if c, err = d.DialContext(ctx, "tcp", root); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return nil, 0, fmt.Errorf("msg: rank %d reaching rank 0's rendezvous at %s: %w", rank, root, ctx.Err())
		case <-time.After(20 * time.Millisecond): // rank 0 may not be listening yet
		}
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	if err := json.NewEncoder(c).Encode(bookEntry{Rank: rank, Dev: dev.String()}); err != nil {
		return nil, 0, fmt.Errorf("msg: rendezvous: %w", err)
	}
	var in []bookEntry
	if err := json.NewDecoder(c).Decode(&in); err != nil {
		return nil, 0, fmt.Errorf("msg: rendezvous: reading the address book: %w", err)
	}
	if len(in) != size {
		return nil, 0, fmt.Errorf("msg: rendezvous: an address book of %d ranks, want %d", len(in), size)
	}
	for i, e := range in {
		a, err := netip.ParseAddrPort(e.Dev)
		if err != nil || e.Rank != i {
			return nil, 0, fmt.Errorf("msg: rendezvous: bad entry %+v", e)
		}
		book[i] = a
		job = e.Job
	}
	return book, job, nil
}

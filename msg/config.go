package msg

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/softrnic/softrnic/verbs"
)

// Config configures a rank. Zero fields take the defaults shown; Rank, Size and Root
// come from the launcher's environment when Size is 0 (see FromEnv), and with no
// launcher the rank is the only one of its job (Rank 0, Size 1).
type Config struct {
	Rank, Size int
	// LocalSize is how many of the job's ranks share this host (0: unknown; from
	// OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS or Slurm's SLURM_STEP_TASKS_PER_NODE),
	// and CPUs how many CPUs the launcher gives each (0: unknown; Slurm's
	// SLURM_CPUS_PER_TASK, srun -c). Init sets GOMAXPROCS to this rank's share: CPUs, or
	// NumCPU/LocalSize (at least 1), as MPI launchers bind each rank to its cores: two
	// ranks each running as many threads as there are CPUs take turns on them, which
	// halves what a connection between them moves. Not when the launcher has bound the
	// process to some of the host's CPUs already (NumCPU is then its share), nor when
	// the GOMAXPROCS environment variable is set, nor with KeepGOMAXPROCS.
	LocalSize, CPUs int
	KeepGOMAXPROCS  bool
	// Root is the address (host:port) of the rendezvous that rank 0 serves and every
	// rank reports to: how the ranks learn each other's devices ($SOFTRNIC_ROOT).
	Root string
	// Job identifies the job: the same in each of its ranks, different from any other
	// job's (from the launcher: Slurm's job and step IDs, Open MPI's PMIx namespace,
	// PMI_JOBID, or the token rmsgrun draws, $SOFTRNIC_JOB). Rank 0's rendezvous
	// refuses a rank that presents another job's (ErrRefused), so that two jobs given
	// one Root never pair up each other's ranks.
	Job string
	// RendezvousTimeout bounds the rendezvous in Init (default 1 minute;
	// $SOFTRNIC_RENDEZVOUS_TIMEOUT): a rank whose rank 0 never answers, or a rank 0
	// some of whose ranks never come, fails with an error that says which.
	RendezvousTimeout time.Duration
	// Addr is this rank's device address ($SOFTRNIC_ADDR; else, in a job of several
	// ranks, the address this host sends from to reach Root's host, so that ranks on
	// several nodes need not be told theirs; else 127.0.0.1). The device takes an
	// ephemeral UDP port, so that ranks on one host share an address.
	Addr netip.Addr
	// Phases are the eager ring's slot sizes, smallest first: every connection starts
	// with Phases[0] and is enlarged, one connection at a time, to the phase a message
	// needs (default 1 KiB, 16 KiB, 128 KiB). A message above the largest phase goes by
	// rendezvous (the sender RDMA-WRITEs it into the receive buffer).
	Phases []int
	// Slots is how many slots a receive ring has; SendSlots how many staging buffers a
	// connection's sender has (defaults 8 and 4).
	Slots, SendSlots int
	// Threshold is the fraction of a slot's payload room that a message may fill and
	// still go in that phase (default 1: whatever fits).
	Threshold float64
	// AckTimeout is how long a sender waits for a complete enlargement acknowledgement
	// before asking for it again (default 100 ms); each further request waits twice as
	// long, and at most three are made (one per spare slot of the acknowledgement area).
	AckTimeout time.Duration
	// Ordering offers weakly-ordered mode on every connection (used if the peer offers it).
	Ordering verbs.Ordering
	// Device overrides the device configuration (Addr and Port are set by the rank).
	Device verbs.DeviceConfig
	// ConnectTimeout bounds how long the first message to a peer waits for the connection.
	ConnectTimeout time.Duration
	// SRQDepth is how many receives the rank's shared receive queue keeps posted (each
	// message or control message from any peer takes one until the rank polls it;
	// default 4096), CQDepth its completion queue (default 32768). A rank of a large
	// job on a small machine may take less.
	SRQDepth, CQDepth int
	// Reserve is how many spare rings and staging buffers of each enlargement phase the
	// rank keeps allocated (not registered) ahead of time, so that an enlargement does
	// not wait for fresh memory (default 1; negative: none).
	Reserve int

	hooks *testHooks
}

// DefaultPhases are the eager slot sizes of Config.Phases when none are given.
var DefaultPhases = []int{1 << 10, 16 << 10, 128 << 10}

func (c *Config) defaults() error {
	if len(c.Phases) == 0 {
		c.Phases = DefaultPhases
	}
	for i, p := range c.Phases {
		if p < hdrLen+8 || p > 1<<24 || (i > 0 && p <= c.Phases[i-1]) {
			return fmt.Errorf("msg: %w: Phases %v: sizes must grow, each from %d bytes to 16 MiB", ErrInvalid, c.Phases, hdrLen+8)
		}
	}
	if len(c.Phases) > 4 {
		return fmt.Errorf("msg: %w: at most 4 phases, not %d", ErrInvalid, len(c.Phases))
	}
	if c.Slots == 0 {
		c.Slots = 8
	}
	if c.SendSlots == 0 {
		c.SendSlots = 4
	}
	if c.Slots < 2 || c.Slots > maxCredits || c.SendSlots < 1 || c.SendSlots > 64 {
		return fmt.Errorf("msg: %w: Slots %d (2..%d) or SendSlots %d (1..64) out of range", ErrInvalid, c.Slots, maxCredits, c.SendSlots)
	}
	if c.Threshold == 0 {
		c.Threshold = 1
	}
	if c.Threshold < 0.1 || c.Threshold > 1 {
		return fmt.Errorf("msg: %w: Threshold %v not in [0.1, 1]", ErrInvalid, c.Threshold)
	}
	if c.AckTimeout == 0 {
		c.AckTimeout = 100 * time.Millisecond
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = 30 * time.Second
	}
	if c.RendezvousTimeout == 0 {
		c.RendezvousTimeout = time.Minute
	}
	if c.RendezvousTimeout < 0 {
		return fmt.Errorf("msg: %w: RendezvousTimeout %v is negative", ErrInvalid, c.RendezvousTimeout)
	}
	if c.Reserve == 0 {
		c.Reserve = 1
	}
	if c.SRQDepth == 0 {
		c.SRQDepth = 4096
	}
	if c.CQDepth == 0 {
		c.CQDepth = 1 << 15
	}
	if c.SRQDepth < 16 || c.SRQDepth > 16384 || c.CQDepth < 2*c.SRQDepth || c.CQDepth > 1<<20 {
		return fmt.Errorf("msg: %w: SRQDepth %d (16..16384) or CQDepth %d (2*SRQDepth..1Mi) out of range", ErrInvalid, c.SRQDepth, c.CQDepth)
	}
	if !c.Addr.IsValid() {
		c.Addr = netip.MustParseAddr("127.0.0.1")
	}
	return nil
}

// threshold is the largest message that goes in phase p's slots.
func (c *Config) threshold(p int) int {
	return int(float64(c.Phases[p]-hdrLen) * c.Threshold)
}

// phaseFor is the smallest phase whose threshold n is under, or -1 (rendezvous).
func (c *Config) phaseFor(n int) int {
	for p := range c.Phases {
		if n <= c.threshold(p) {
			return p
		}
	}
	return -1
}

// testHooks let tests lose, delay or corrupt enlargement acknowledgements.
type testHooks struct {
	// ack is called with the acknowledgement the receiver is about to write; it
	// returns the bytes to write (nil: write nothing).
	ack func(to int, b []byte) []byte
}

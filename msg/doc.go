// Package msg is an MPI-style messaging layer over softrnic's RDMA verbs: a job of N
// ranks that exchange tagged messages point to point with MPI's matching rules, and a few
// collectives (Barrier, Bcast, Allreduce, Allgather) built on them.
//
// It is for Go programs that would use MPI's point-to-point calls: they call Init, then
// Send and Recv, or Isend and Irecv and Wait on the Request, and Probe, and never see a
// queue pair or a memory registration. Every pair of ranks that talks has one reliable
// connection (an RC queue pair, made through package cm). Every connection starts with
// small receive buffers and grows them only when its own messages need it, so that a
// rank with a thousand connections holds little registered memory, while a connection
// that carries large messages gets buffers their size.
//
// Every method of Comm may be called from any goroutine.
//
// # Starting a job
//
// A launcher runs one process per rank and tells each its rank and the job's size in the
// environment: Open MPI's mpirun (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE), Slurm's
// srun (SLURM_PROCID, SLURM_STEP_NUM_TASKS), or a PMI launcher such as this module's
// rmsgrun (PMI_RANK, PMI_SIZE). Init with a zero Config reads them (see FromEnv), and also:
//
//   - SOFTRNIC_ROOT, where rank 0 serves the job's rendezvous: host:port, or a host alone
//     to take the port Slurm reserved for the step (srun --resv-ports) or one drawn from
//     the job's identity (RootPort); required when the job has more than one rank;
//   - SOFTRNIC_ADDR, the IP address of this rank's device (default: the address this
//     host reaches rank 0's host from, so each node of a job takes its own);
//   - how many ranks share this host (OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS, or
//     Slurm's SLURM_STEP_TASKS_PER_NODE for this node), from which Init gives each rank
//     its share of the CPUs (Config.LocalSize);
//   - the job's identity (Slurm's job and step IDs, Open MPI's PMIX_NAMESPACE, PMI_JOBID,
//     or SOFTRNIC_JOB, which rmsgrun draws), which every rank presents at the rendezvous
//     (Config.Job);
//   - SOFTRNIC_RENDEZVOUS_TIMEOUT, how long the rendezvous may take (default 1 minute).
//
// A Slurm batch script itself is not a rank (only an srun step's tasks are): started in
// one without srun, a program is a job of one rank.
//
// A program may instead fill Config.Rank, Size and Root itself, as the example does to
// run both ranks of a job in one process. A program run without a launcher (none of the
// rank variables set) and with no Rank and Size of its own is a job of one rank, as an
// MPI program run without mpirun is: Rank 0, Size 1, its sends to itself and its
// collectives work, and nothing is dialled.
//
// Each rank opens a device of its own on an ephemeral UDP port of its address, so that
// ranks on one host share the address. Then the ranks find each other: rank 0 listens
// on the rendezvous address (TCP), every other rank connects to it (retrying until rank 0
// is up) and reports its rank, the job's size and identity and its device's address, and
// once all have reported, rank 0 sends every rank the whole address book and a job ID it
// drew at random. That is all the rendezvous is for: from then on the ranks talk through
// their devices only. Rank 0 refuses at once, saying why, a rank of another job (two jobs
// given one SOFTRNIC_ROOT), of a job of another size, or a rank it has heard from
// already: that rank's Init fails with ErrRefused, and rank 0 goes on waiting for its own.
// Rank 0 keeps the rendezvous open until Close, refusing every later report the same way.
// The rendezvous ends within Config.RendezvousTimeout: a rank whose rank 0 never answers
// fails saying so, and a rank 0 whose ranks do not all come fails naming the missing
// ones, and tells the ranks that came.
// Every rank's device listens for connection requests on the connection manager's port
// 18600.
//
// # Connections
//
// Connections are made on first use, not when the job starts: a rank of a large job talks
// to few of the others (a tree collective to log2 N of them), and a connection not used
// costs nothing. The first send to a rank dials it. The request carries the job ID, the
// caller's rank, its first receive ring and its acknowledgement area (both below), and
// the answer carries the same of the acceptor, so that either side may write into the
// other as soon as the connection is up. A request from another job's rank is refused.
// When two ranks dial each other at the same time, the lower rank's request wins and the
// other one is dropped.
//
// A connection that fails (its peer's process died or closed its device, or the connection
// manager's keep-alive found it gone, or found a new process's device at its address)
// fails every request that involves the peer with ErrPeerGone, once the messages the peer
// sent before are received; the rank's other connections go on. Close waits for a dead
// rank one keep-alive period at most (see Comm.Close), CloseContext until its context
// ends.
//
// # Small messages: the eager rings
//
// Each direction of a connection has a ring: Config.Slots slots (8 by default) of the
// connection's current slot size, in the receiver's memory, registered so that the peer
// may write into it. A message that fits a slot goes eagerly. The sender copies it,
// behind a 48-byte header (its kind, tag, source and length), into one of its
// Config.SendSlots staging buffers (4 by default), and posts an RDMA WRITE with immediate
// data from there into the peer's next slot. The send is complete once the copy is made:
// the caller's buffer is free again.
//
// The immediate data names the slot. Its arrival, as the completion of one of the
// zero-length receives the rank keeps posted on a receive queue shared by all its
// connections, is how the receiver learns that the slot is full: it never polls the
// ring's memory, whose bytes may land in any order when the connection runs in
// weakly-ordered mode (Config.Ordering). The receiver takes the slots in the order they
// were written and copies each message into the receive that matches it, or keeps a copy
// until one is posted; then the slot is free again.
//
// Credits keep a sender from overwriting a slot the receiver has not taken yet. The sender
// starts with one credit per slot of the peer's ring and spends one per write; it waits
// when it has none, and nothing is ever dropped. The receiver gives credits back for the
// slots it has taken, in the immediate data of its own writes to the sender or, once it
// owes half a ring's worth that no write of its own carried, in a zero-length RDMA WRITE
// with immediate data of their own (Stats.CreditMessages).
//
// # Growing a connection: buffer enlargement
//
// Config.Phases lists the slot sizes a ring may have, smallest first (1 KiB, 16 KiB and
// 128 KiB by default). Every connection starts in the first phase: with the defaults an
// idle connection holds 12 KiB and a few hundred bytes registered (its ring, its staging
// buffers and its acknowledgement area). A message too large for the peer's current
// slots makes that direction of that connection grow, to the smallest phase the message
// fits in, in three steps:
//
//  1. The sender asks. Its send routine walks the connection's send vector, the messages
//     waiting for the connection in the order they were sent, and sends the longest prefix
//     that fits the current slots as usual. When the first message waiting does not fit,
//     the sender writes a control message through the current slots, after everything it
//     wrote before; it names the phase needed, a fresh nonce, and the slot of the sender's
//     acknowledgement area to answer into. From then on the sender writes nothing more
//     into that ring. Until the answer is in, its send routine reports that it sent
//     nothing and returns: it never blocks, and the rank's other connections keep moving.
//  2. The receiver provisions. It takes its slots in order, so when it reaches the control
//     message it has taken every message written before it, and the old ring holds nothing
//     anyone needs. It unregisters the old ring, registers one of the phase asked for, and
//     acknowledges: it writes the new ring's address, remote key, slot count, slot size
//     and phase, with a CRC-32 of them and the nonce as a head and a tail flag, into the
//     sender's acknowledgement area, with one RDMA WRITE whose immediate data tells the
//     sender it was written.
//  3. The sender switches. It reads the acknowledgement only after that notification has
//     arrived, and takes it only if head and tail both carry its nonce, the CRC matches,
//     and the phase and slot size are those it asked for: a partial, stale or corrupt one
//     leaves it waiting. It then unregisters its staging buffers (or, if writes from them
//     are still in flight, once those complete), registers larger ones, and writes into the
//     new ring from its first slot, with one credit per slot of the new ring: the
//     messages that waited go out in their order.
//
// The two ranks agree on the new size by the phase's number: every rank of a job has the
// same Config.Phases (a connection whose two sides' first slot sizes differ is dropped
// with an error), and the acknowledgement repeats the size, which the sender checks. Messages
// keep their order through an enlargement: those written before the control message are
// taken from the old ring before it goes, and those after it wait in the send vector and
// go into the new ring. Credits carry the generation of the ring they are for, so that
// credits for the old ring still on their way are ignored. If no complete acknowledgement
// has arrived after Config.AckTimeout, the sender asks the receiver to write it again
// into the next slot of its acknowledgement area (a slot no earlier write can still be
// landing in), waiting twice as long each time, at most three times. Each direction of a
// connection grows on its own, one phase or more at a time, and never shrinks.
//
// The memory an enlargement registers comes from a reserve of spare buffers the rank keeps
// ready for each phase above the first (Config.Reserve), refilled after use, so that an
// enlargement waits neither for the allocator nor for the pages' first faults.
//
// # Large messages: rendezvous
//
// A message larger than the largest phase's slots is not copied. The sender writes a
// request to send (its length and a message ID) into the eager ring. When a receive
// matches it, the receiver registers the receive buffer and answers clear to send, with
// the buffer's address and remote key; the sender RDMA-WRITEs the message straight from
// its own buffer into it and writes FIN into the ring after it. The send completes when
// its WRITE does; the receive completes on FIN, which the receiver cannot see before the
// data is in place. Buffers stay registered in a per-rank registration cache, so that
// sending from or receiving into the same buffer again costs no registration.
//
// # Matching and progress
//
// Matching is MPI's: a receive takes the first message arrived, in arrival order, whose
// source and tag match it (AnySource and AnyTag match any), and a message takes the first
// posted receive that matches it; messages from one rank do not overtake each other. A
// message longer than the receive buffer fills it and ends the receive with ErrTruncated.
// A Wait whose context ends withdraws a receive not yet matched or a send not yet started.
// Collectives travel in a context of their own, which user receives never match; every
// rank must call the same collectives in the same order.
//
// Connections move only when someone progresses them: a call that starts an operation, a
// Wait or Test polling for its request in the caller's goroutine (as MPI libraries
// progress in the caller's thread), or, when no caller polls, the rank's progress
// goroutine, which sleeps until a completion arrives. A Wait polls for a short while
// after the last progress, then sleeps; ranks that outnumber their host's CPUs do not poll.
// The blocking Send and Recv allocate nothing.
//
// # Watching a rank
//
// Stats counts what a rank's connections did (messages eager and by rendezvous,
// enlargements asked for and served, connections). Memory reports what each connection
// holds registered, and in which phase each direction is; LargeFromStart what a
// connection would hold with the largest slots from the start. LabStats is for
// experiments on the enlargement itself: how often the send routine waited, and where the
// time of the last enlargement went.
//
// # Errors
//
// Errors name the call ("msg: send to rank 5 with tag 1: invalid argument: there is no
// rank 5 in a job of 2 ranks (0 to 1)") and wrap ErrInvalid, ErrTruncated, ErrPeerGone,
// ErrClosed or the context's error, for errors.Is. docs/errors.md in the repository lists
// them with what to do.
package msg

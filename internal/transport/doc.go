// Package transport is softrnic's "hardware": the per-device engine that moves RoCEv2
// packets between UDP sockets and registered memory. It holds the queue-pair state
// machines (requester, completer, responder), completion queues, receive queues, the
// retransmission timers and the counters, and is driven by one receive goroutine per
// receive queue of a device (queue.go: a socket each, the kernel steering every packet to
// the queue of its destination QP) plus whichever goroutine posts work or polls a
// completion queue (run to completion, no per-packet hand-offs).
//
// The public verbs API (package verbs) wraps it the way a libibverbs provider wraps a NIC:
// it validates calls, converts work requests to WQEs and CQEs to work completions.
//
// # Memory after deregistration
//
// After DeregMR returns, no operation on behalf of a peer reads or writes the region's
// memory. The engine does it by revocation and a barrier, not by looking the key up for
// every packet: every access to registered memory on behalf of a peer (placing a WRITE or
// SEND, producing a READ response, executing an atomic) happens while the receive path of
// the QP's queue is held (queue.rxMu); whatever keeps a region across packets — a multi-packet WRITE in
// progress, the responder's READ and atomic resources (replayed for duplicate requests),
// weak mode's held READs and atomics, a receive WQE bound to a message — keeps the
// *tpt.Region with the memory and asks Region.Revoked before each access. Deregistration
// marks the region revoked, then Device.Quiesce waits for each queue's receive path to be
// released once: an access that checked the region before it was revoked has then finished, and every
// later one sees the revocation. The message it interrupts ends with a NAK (remote access
// error for WRITE, READ and atomics; remote operational error and a local protection error
// completion for a SEND's receive buffer) and the QP in ERR, as for a key that was never
// valid. This costs one atomic load per packet where a key lookup per packet would cost two
// and a bounds check, and it also covers the READ resources that outlive their request.
//
// # Locks
//
// The locking contract of the whole package, in one place. Locks are taken in this order,
// never the other way round (a goroutine holding a lock on the right never waits for one on
// its left):
//
//	queue.rxMu → QP.mu → RecvQueue.mu, CQ.mu, Device.atomicMu, timerQueue.mu, AckGroup.mu, batchList.mu, tpt.Table.mu
//
// Device.qpMu (the QP table) is taken alone or under rxMu, never with a QP's lock held.
// Another queue's rxMu (of the same device or another) is only ever TryLocked, by a
// poller holding no lock (AckGroup.flushOthers), and a QP's lock from there too. Quiesce and the tests take
// a device's queues' rxMu one after another, in queue order, holding no other lock.
// The locks after QP.mu are leaves: nothing else is taken while one of them is held, and
// no callback runs under them. (tpt.Table.mu is the translation table's, taken to register
// and deregister memory regions; lookups take no lock.)
//
// Every one of these locks carries its rank in this order (internal/lockrank, and
// lockrank.go here). Built with the lockcheck tag (`go test -tags lockcheck`), a Lock that
// would wait on a lock of the same or a lower rank than one the goroutine holds, or on a
// lock without a rank while it holds one, panics.
//
//   - queue.rxMu guards a receive queue's state (the batches being received and built,
//     the lists of QPs with ACKs, responses and requester work pending, held-back ACKs).
//     Whoever processes the queue's packets holds it: its receive goroutine, its timer
//     goroutine draining the socket before a loss timeout, or a consumer polling a CQ
//     (CQ.Progress, which only TryLocks it; while the system stops polling threads, only
//     when the socket holds a datagram or the queue has ACKs or responses to send, so that
//     a stopped polling thread holds nothing the device needs: stallWatch). A QP's
//     packets are processed only under its own queue's rxMu (QP.home): a packet that
//     reaches another queue is dropped. It is held across the sendmmsg of the receive
//     path's own batch, never across a socket read that can block.
//   - QP.mu guards everything in a QP below the line "mu" in its declaration, including
//     the requester, responder, weak-mode and limit-queue state. It is never held across a
//     system call: a goroutine that sends a QP's packets builds them under QP.mu, drops
//     it, sends, and takes it again. Functions that do that say so in their name:
//     ...Unlock returns with the caller's QP.mu released; ...Relock releases it and takes
//     it again before returning (state may have changed meanwhile: the QP may have been
//     destroyed or moved to ERR).
//   - Transmit ownership (QP.txOwner, under QP.mu) makes one goroutine at a time the
//     builder of a QP's requests, so packets leave in PSN order without holding QP.mu
//     across the send; work arriving meanwhile sets txPending and is picked up by the
//     owner. Destroy waits on QP.txIdle until no goroutine owns transmission.
//   - RecvQueue.mu, CQ.mu and the rest guard their own objects only (batchList.mu: the
//     device's spare send batches).
//
// Callbacks into the layer above (package verbs) are CQ notify functions and
// Device.OnEvent. They run with no lock of the CQ or receive queue that fired them, but
// possibly with rxMu and a QP's mu held: they must only queue work (wake a channel, append
// to a queue under their own leaf lock) and never call back into the engine.
//
// Memory of a QP that is reached without QP.mu: its packets in flight in a batch being sent
// (they reference registered memory and the peer's address, which ModifyQP replaces rather
// than modifies) — Destroy returns only when no goroutine owns the QP's transmission and
// every queue's receive path has been released once (Device.Quiesce).
package transport

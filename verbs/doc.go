// Package verbs is softrnic's RDMA verbs API: the libibverbs programming model, written
// the Go way, over a software RDMA NIC that speaks RoCEv2 on ordinary UDP sockets (no
// cgo, no kernel module, no RDMA hardware).
//
// The objects and calls are the ones a verbs programmer knows:
//
//	dev, _ := verbs.OpenDevice(verbs.DeviceConfig{Addr: netip.MustParseAddr("127.0.0.1")})
//	da := dev.QueryDevice()                          // ibv_query_device
//	pd, _ := dev.AllocPD()                           // ibv_alloc_pd
//	mr, _ := pd.RegMR(buf, verbs.AccessLocalWrite)   // ibv_reg_mr
//	ch, _ := dev.CreateCompChannel()                 // ibv_create_comp_channel
//	cq, _ := dev.CreateCQ(16, ch, 0)                 // ibv_create_cq
//	qp, _ := pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: qpCap})
//	qp.ModifyQP(&qpAttr, mask)                       // RESET -> INIT -> RTR -> RTS, a call each
//	cq.ReqNotifyCQ(false)                            // ibv_req_notify_cq
//	qp.PostRecv(recvWRs); qp.PostSend(sendWRs)       // ibv_post_recv / ibv_post_send
//	got, _ := ch.GetCQEvent(context.Background())    // ibv_get_cq_event
//	got.AckCQEvents(1)                               // ibv_ack_cq_events
//	n := cq.PollCQ(wc)                               // ibv_poll_cq
//
// The package's CompletionChannel example is this sequence, runnable (and checked by go
// test). Connect does the three ModifyQP calls from the peer's Endpoint.
//
// Errors are Go errors that name the call and say what was wrong ("verbs: PostSend: work
// request 1 refused: ..."); they wrap ErrInvalid, ErrBusy, ErrLimit or ErrClosed (every
// call on a destroyed object or a closed device), for errors.Is. Post errors are
// *PostError and name the refused work request (and SGE, for one outside its region).
// Work completions carry libibverbs statuses. Every enum prints its name. docs/errors.md
// in the repository lists every error with what to do.
//
// # Devices and addresses
//
// A device is one IP address and UDP port (4791 by default). A QP's address vector names
// the peer device by GID (its IP address) and, as a softrnic extension, its UDP port. On
// one host use 127.0.0.1, 127.0.0.2, ... as separate devices, or AnyPort.
//
// # Progress
//
// Each device has a receive goroutine that sleeps in the runtime's network poller and
// processes every packet to completion (placement, ACKs, completions). PollCQ on an empty
// queue also processes whatever packets are waiting, in the caller's goroutine, so a
// busy-polling consumer sees completions without waiting for that goroutine to wake.
//
// # Ordered and weakly-ordered queue pairs
//
// A QP is ordered (standard RC, the default) or weakly ordered (QPAttr.Ordering, set on
// INIT->RTR with QPAttrOrdering; Connect sets it when both endpoints offer it). Both
// complete work requests in posting order with the same statuses. (A weakly-ordered QP
// on a shared receive queue takes a receive WQE when a message's first packet arrives,
// so its receive completions come in message order, not necessarily in the SRQ's
// posting order: on an SRQ, other QPs take WQEs in between anyway.) They differ on the wire
// and under loss: an ordered QP places packets in order and, when one is lost, goes back
// and resends everything after it; a weakly-ordered QP places every packet the moment it
// arrives, holds what it completes until the hole before it closes, acknowledges
// selectively and resends only what was lost. QP.Holes shows the open holes and what
// waits on each.
//
// Memory visibility in weak mode: the bytes of a message may land in any order, and a
// later message's bytes may land before an earlier one's. Only a completion (a receive
// CQE, or the CQE of a later message) says that a message's bytes are all in place, as
// with ConnectX's out-of-order placement: do not poll the last byte of a buffer to learn
// that an RDMA WRITE finished.
//
// # Completion handlers
//
// A device has DeviceConfig.CompletionHandlers completion handlers (libibverbs'
// completion vectors; QueryDevice reports NumCompVectors), each with an optional CPU set
// and a priority. SetCompletionHandler registers a function on one; CreateCQ's compVector
// binds a CQ to one and ModifyCQ re-binds it (or removes the binding, NoHandler) while
// completions flow. An armed CQ's event goes to its handler's function if one is
// registered, otherwise to its completion channel. Each handler is a goroutine locked to
// its own OS thread, pinned to its CPUs; a higher-priority handler's events are
// dispatched first. ModifyCQ also sets event moderation (a count and a period), and a
// handler function that stops after a budget calls ScheduleEvent to be called again after
// the handler's other CQs. See SetCompletionHandler, CQ.ReqNotifyCQ (the arm-then-drain
// loop) and HandlerStats (calls, notification latency).
//
// # Memory
//
// Registered memory is a Go []byte kept referenced by its MR. RDMA addresses are IOVAs:
// by default the buffer's virtual address (RegMR), or any base chosen with RegMRIOVA.
// Every local and remote access is checked against the region's protection domain, key,
// access rights and bounds. Atomics operate on 8-byte aligned words in host byte order
// and are atomic with respect to other atomics through the same device (AtomicHCA).
package verbs

package verbs

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softrnic/softrnic/internal/transport"
)

// WCStatus is a work completion status (ibv_wc_status values).
type WCStatus int

// Work completion statuses.
const (
	WCSuccess          WCStatus = 0
	WCLocLenErr        WCStatus = 1
	WCLocQPOpErr       WCStatus = 2
	WCLocEECOpErr      WCStatus = 3
	WCLocProtErr       WCStatus = 4
	WCWRFlushErr       WCStatus = 5
	WCMWBindErr        WCStatus = 6
	WCBadRespErr       WCStatus = 7
	WCLocAccessErr     WCStatus = 8
	WCRemInvReqErr     WCStatus = 9
	WCRemAccessErr     WCStatus = 10
	WCRemOpErr         WCStatus = 11
	WCRetryExcErr      WCStatus = 12
	WCRNRRetryExcErr   WCStatus = 13
	WCLocRDDViolErr    WCStatus = 14
	WCRemInvRDReqErr   WCStatus = 15
	WCRemAbortErr      WCStatus = 16
	WCInvEECNErr       WCStatus = 17
	WCInvEECStateErr   WCStatus = 18
	WCFatalErr         WCStatus = 19
	WCRespTimeoutErr   WCStatus = 20
	WCGeneralErr       WCStatus = 21
	wcStatusNamesCount          = 22
)

var wcStatusNames = [wcStatusNamesCount]string{
	"success", "local length error", "local QP operation error", "local EE context operation error",
	"local protection error", "Work Request Flushed Error", "memory management operation error",
	"bad response error", "local access error", "remote invalid request error", "remote access error",
	"remote operation error", "transport retry counter exceeded", "RNR retry counter exceeded",
	"local RDD violation error", "remote invalid RD request", "aborted error", "invalid EE context number",
	"invalid EE context state", "fatal error", "response timeout error", "general error",
}

// String returns the status text, as ibv_wc_status_str.
func (s WCStatus) String() string {
	if s >= 0 && int(s) < len(wcStatusNames) {
		return wcStatusNames[s]
	}
	return fmt.Sprintf("unknown status %d", int(s))
}

// WCOpcode is the operation a work completion is for (ibv_wc_opcode values).
type WCOpcode int

// Work completion opcodes.
const (
	WCSend            WCOpcode = 0
	WCRDMAWrite       WCOpcode = 1
	WCRDMARead        WCOpcode = 2
	WCCompSwap        WCOpcode = 3
	WCFetchAdd        WCOpcode = 4
	WCRecv            WCOpcode = 128
	WCRecvRDMAWithImm WCOpcode = 129
)

var wcOpcodeNames = map[WCOpcode]string{
	WCSend: "SEND", WCRDMAWrite: "RDMA_WRITE", WCRDMARead: "RDMA_READ", WCCompSwap: "COMP_SWAP",
	WCFetchAdd: "FETCH_ADD", WCRecv: "RECV", WCRecvRDMAWithImm: "RECV_RDMA_WITH_IMM",
}

func (o WCOpcode) String() string {
	if s, ok := wcOpcodeNames[o]; ok {
		return s
	}
	return fmt.Sprintf("WCOpcode(%d)", int(o))
}

// WCFlags are work completion flags (ibv_wc_flags values).
type WCFlags uint32

// Work completion flags.
const (
	WCGRH     WCFlags = 1 // UD: the receive buffer starts with the GRH area (GRHLen bytes)
	WCWithImm WCFlags = 2 // ImmData is valid
)

// WorkCompletion is one completed work request (ibv_wc). When Status is not WCSuccess only
// WRID, Status, QPNum and VendorErr are meaningful.
type WorkCompletion struct {
	WRID      uint64
	Status    WCStatus
	Opcode    WCOpcode
	VendorErr VendorErr // what the status does not say (print it with %v)
	ByteLen   uint32
	ImmData   uint32 // in host byte order (the wire carries it big-endian)
	QPNum     uint32
	SrcQP     uint32
	WCFlags   WCFlags
	// SrcPort (a softrnic extension, UD receives only) is the datagram's UDP source port.
	// A softrnic device sends from the port it listens on, so this is where to answer it
	// (the GRH area holds its IP address); a standard RoCEv2 peer picks a source port as
	// flow entropy and listens on 4791.
	SrcPort uint16
}

// CQ is a completion queue (ibv_cq).
type CQ struct {
	ctx     *Device
	cq      *transport.CQ
	channel *CompChannel

	handler   atomic.Pointer[handler] // bound completion handler (nil: none)
	destroyed atomic.Bool
	empty     atomic.Uint32 // PollCQ calls that found nothing (see pollYield)

	mu    sync.Mutex
	cond  *sync.Cond
	users int // QPs using the CQ (guarded by ctx.mu)
	dead  bool
	taken int // events GetCQEvent returned for this CQ
	acked int
}

// CreateCQ creates a completion queue with room for at least cqe completions. compVector
// binds it to a completion handler, in [0, NumCompVectors), or is NoHandler. Its events
// go to that handler's function when one is registered (SetCompletionHandler), and
// otherwise to channel (may be nil).
func (c *Device) CreateCQ(cqe int, channel *CompChannel, compVector int) (*CQ, error) {
	if cqe < 1 || cqe > maxCQE {
		return nil, fmt.Errorf("verbs: CreateCQ: %w: cqe %d not in 1..%d", ErrInvalid, cqe, maxCQE)
	}
	var h *handler
	if compVector != NoHandler {
		var err error
		if h, err = c.handlerAt("CreateCQ", compVector); err != nil {
			return nil, err
		}
	}
	if channel != nil && channel.ctx != c {
		return nil, fmt.Errorf("verbs: CreateCQ: %w: channel belongs to another device", ErrInvalid)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.check(); err != nil {
		return nil, fmt.Errorf("verbs: CreateCQ: %w", err)
	}
	if c.cqs >= maxCQ {
		return nil, fmt.Errorf("verbs: CreateCQ: %w (max_cq %d)", ErrLimit, maxCQ)
	}
	if channel != nil {
		if err := channel.attach(); err != nil {
			return nil, fmt.Errorf("verbs: CreateCQ: %w", err)
		}
	}
	cq := &CQ{ctx: c, cq: c.dev.NewCQ(cqe), channel: channel}
	cq.handler.Store(h)
	cq.cond = sync.NewCond(&cq.mu)
	cq.cq.Owner = cq
	cq.cq.SetNotify(cq.onEvent)
	c.cqs++
	c.cqSet[cq] = struct{}{}
	return cq, nil
}

// CQE returns the number of completions the CQ holds.
func (cq *CQ) CQE() int { return cq.cq.Cap() }

// Channel returns the completion channel the CQ reports events to, or nil.
func (cq *CQ) Channel() *CompChannel { return cq.channel }

// CompVector returns the completion handler the CQ is bound to, or NoHandler.
func (cq *CQ) CompVector() int {
	if h := cq.handler.Load(); h != nil {
		return h.id
	}
	return NoHandler
}

// onEvent is called by the engine when the armed CQ raises its event.
func (cq *CQ) onEvent(*transport.CQ) { cq.route(nanotime(), nil) }

// route delivers an event raised at time at: to the CQ's handler if it has a function
// (unless that handler is from, which is passing the event on), else to its channel.
func (cq *CQ) route(at int64, from *handler) {
	if h := cq.handler.Load(); h != nil && h != from && h.accepting() {
		h.post(cq, at)
		return
	}
	if cq.channel != nil {
		cq.channel.deliver(cq)
		return
	}
	if from != nil {
		from.dropped.Add(1)
	}
}

// CQAttr is what ModifyCQ changes (ibv_modify_cq_attr, and the completion handler).
type CQAttr struct {
	// Handler re-binds the CQ to a completion handler, or removes the binding
	// (NoHandler). Events raised from then on go to the new handler; one already queued
	// to the old handler is still handled there, once. So the CQ's function may run on
	// both at once for a while (the old handler's call still draining the CQ as the new
	// one's begins): calls for one CQ may overlap.
	Handler int
	// ModerationCount and ModerationPeriod coalesce events (ibv_modify_cq's cq_count and
	// cq_period): an armed CQ raises its event once ModerationCount matching completions
	// arrived or ModerationPeriod passed since the first of them, whichever comes first.
	// 0 and 0 (the default): at the first.
	ModerationCount  int
	ModerationPeriod time.Duration
}

// CQAttrMask selects what ModifyCQ changes.
type CQAttrMask int

// ModifyCQ attributes.
const (
	CQAttrHandler    CQAttrMask = 1 << iota // Handler
	CQAttrModeration                        // ModerationCount and ModerationPeriod
)

// Moderation limits.
const (
	MaxModerationCount  = 65535
	MaxModerationPeriod = time.Second
)

// ModifyCQ re-binds the CQ to another completion handler (or none) and sets its event
// moderation. Both are safe while completions flow: no event is lost or delivered twice.
func (cq *CQ) ModifyCQ(attr *CQAttr, mask CQAttrMask) error {
	if attr == nil {
		return fmt.Errorf("verbs: ModifyCQ: %w: nil attributes", ErrInvalid)
	}
	if mask == 0 || mask&^(CQAttrHandler|CQAttrModeration) != 0 {
		return fmt.Errorf("verbs: ModifyCQ: %w: mask %#x (want CQAttrHandler and/or CQAttrModeration)", ErrInvalid, int(mask))
	}
	if cq.destroyed.Load() {
		return fmt.Errorf("verbs: ModifyCQ: %w", ErrClosed)
	}
	var h *handler
	if mask&CQAttrHandler != 0 && attr.Handler != NoHandler {
		var err error
		if h, err = cq.ctx.handlerAt("ModifyCQ", attr.Handler); err != nil {
			return err
		}
	}
	if mask&CQAttrModeration != 0 {
		if attr.ModerationCount < 0 || attr.ModerationCount > MaxModerationCount {
			return fmt.Errorf("verbs: ModifyCQ: %w: moderation count %d not in 0..%d", ErrInvalid, attr.ModerationCount, MaxModerationCount)
		}
		if attr.ModerationPeriod < 0 || attr.ModerationPeriod > MaxModerationPeriod {
			return fmt.Errorf("verbs: ModifyCQ: %w: moderation period %v not in 0..%v", ErrInvalid, attr.ModerationPeriod, MaxModerationPeriod)
		}
	}
	if mask&CQAttrHandler != 0 {
		cq.handler.Store(h)
	}
	if mask&CQAttrModeration != 0 {
		cq.cq.SetModeration(attr.ModerationCount, attr.ModerationPeriod)
	}
	return nil
}

// ScheduleEvent raises the CQ's event now, without a new completion, as if it had been
// armed (an arming still pending is used up: one event either way). A handler function
// that stops after a budget of completions, with more waiting, calls it instead of
// ReqNotifyCQ: the CQ's event goes to the back of its handler's queue, so the handler's
// other CQs get their turn first (as a NAPI poll function reschedules itself).
func (cq *CQ) ScheduleEvent() error {
	if cq.destroyed.Load() {
		return fmt.Errorf("verbs: ScheduleEvent: %w", ErrClosed)
	}
	if err := cq.canNotify("ScheduleEvent"); err != nil {
		return err
	}
	cq.cq.Fire()
	return nil
}

// canNotify checks that the CQ's events have somewhere to go: a completion channel, or a
// handler with a function.
func (cq *CQ) canNotify(op string) error {
	if h := cq.handler.Load(); cq.channel == nil && (h == nil || h.fn.Load() == nil) {
		return fmt.Errorf("verbs: %s: %w: the CQ has no completion channel and no completion handler function", op, ErrInvalid)
	}
	return nil
}

// QueryCQ returns the CQ's handler binding and moderation.
func (cq *CQ) QueryCQ() CQAttr {
	n, p := cq.cq.Moderation()
	return CQAttr{Handler: cq.CompVector(), ModerationCount: n, ModerationPeriod: p}
}

// Device returns the device the CQ belongs to.
func (cq *CQ) Device() *Device { return cq.ctx }

// pollChunk is how many completions PollCQ moves per step (on the stack, so polling
// allocates nothing).
const pollChunk = 16

// Wait polls the CQ until it returns at least one completion (into wc), ctx is done
// (ctx.Err()) or the device is closed or the CQ destroyed (an error wrapping ErrClosed). It busy-polls as a
// consumer polling a CQ does, driving the device's receive path and yielding the processor
// between polls; to sleep until a completion arrives use a completion channel or handler.
func (cq *CQ) Wait(ctx context.Context, wc []WorkCompletion) (int, error) {
	if len(wc) == 0 {
		return 0, fmt.Errorf("verbs: CQ.Wait: %w: no room for a completion", ErrInvalid)
	}
	for {
		if n := cq.PollCQ(wc); n > 0 {
			return n, nil
		}
		if cq.destroyed.Load() {
			return 0, fmt.Errorf("verbs: CQ.Wait: the CQ was destroyed: %w", ErrClosed)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-cq.ctx.done:
			return 0, fmt.Errorf("verbs: CQ.Wait: %w", ErrClosed)
		default:
		}
		runtime.Gosched()
	}
}

// PollCQ moves up to len(wc) completions into wc, oldest first, and returns how many.
// When the CQ is empty it first lets the device process packets that are waiting (in the
// calling goroutine), so a busy-polling consumer sees a completion as soon as its packet
// arrives.
func (cq *CQ) PollCQ(wc []WorkCompletion) int {
	n := cq.poll(wc)
	if n == 0 && len(wc) > 0 {
		cq.cq.Progress()
		n = cq.poll(wc)
		if n == 0 && cq.empty.Add(1)%pollYield == 0 {
			runtime.Gosched()
		}
	}
	return n
}

// pollYield is how many empty polls of a CQ let other goroutines run once: a consumer
// polling in a loop on every processor would otherwise hold them until the runtime
// preempts it (10 ms), and the device's goroutines, timers and the application's other
// goroutines would wait that long (send_lat p99 150-300 µs, 30 µs with it; the Gosched
// costs about as much as one empty poll's system call).
const pollYield = 64

func (cq *CQ) poll(wc []WorkCompletion) int {
	if cq.cq.Len() == 0 {
		return 0
	}
	var buf [pollChunk]transport.CQE
	total := 0
	for total < len(wc) {
		k := cq.cq.Poll(buf[:min(pollChunk, len(wc)-total)])
		for i := 0; i < k; i++ {
			e := &buf[i]
			wc[total+i] = WorkCompletion{
				WRID: e.WRID, Status: WCStatus(e.Status), Opcode: WCOpcode(e.Opcode), VendorErr: VendorErr(e.VendorErr),
				ByteLen: e.ByteLen, ImmData: e.Imm, QPNum: e.QPN, SrcQP: e.SrcQP, WCFlags: WCFlags(e.Flags), SrcPort: e.SrcPort,
			}
		}
		total += k
		if k < pollChunk {
			break
		}
	}
	return total
}

// ReqNotifyCQ arms the CQ for one event: on the next completion, or with solicitedOnly
// on the next solicited or error completion (a receive completion is solicited when the
// message's last packet had the solicited-event bit: SendSolicited on a SEND or an RDMA
// WRITE with immediate). The event goes to the CQ's completion handler function, or its
// channel. Completions already in the queue do not raise it, so the loop that never
// misses an event is: handle the event, then
//
//	for {
//		for n := cq.PollCQ(wc); n > 0; n = cq.PollCQ(wc) { ... }  // drain
//		cq.ReqNotifyCQ(false)                                     // arm
//		if n := cq.PollCQ(wc); n == 0 { break }                   // drain again: a completion
//		... handle those n ...                                    // that came before the arm
//	}
//
// (a completion that arrives between the last empty poll and the arm raises no event; the
// poll after the arm finds it. An event may then still come for it: harmless. Those polls
// after the arm go on until the CQ is empty: a function that handles one poll's worth and
// leaves the rest to the arm strands them, since only a completion that arrives after the
// arm raises its event.)
func (cq *CQ) ReqNotifyCQ(solicitedOnly bool) error {
	if cq.destroyed.Load() {
		return fmt.Errorf("verbs: ReqNotifyCQ: %w", ErrClosed)
	}
	if err := cq.canNotify("ReqNotifyCQ"); err != nil {
		return err
	}
	cq.cq.Arm(solicitedOnly)
	return nil
}

// AckCQEvents acknowledges n events GetCQEvent returned for this CQ.
func (cq *CQ) AckCQEvents(n int) {
	cq.mu.Lock()
	cq.acked += n
	if cq.acked > cq.taken {
		cq.acked = cq.taken
	}
	cq.cond.Broadcast()
	cq.mu.Unlock()
}

// ResizeCQ changes the CQ's capacity; it fails if more completions wait than would fit.
func (cq *CQ) ResizeCQ(cqe int) error {
	if cqe < 1 || cqe > maxCQE {
		return fmt.Errorf("verbs: ResizeCQ: %w: cqe %d not in 1..%d", ErrInvalid, cqe, maxCQE)
	}
	if cq.destroyed.Load() {
		return fmt.Errorf("verbs: ResizeCQ: %w", ErrClosed)
	}
	if !cq.cq.Resize(cqe) {
		return fmt.Errorf("verbs: ResizeCQ: %w: %d completions are waiting", ErrInvalid, cq.cq.Len())
	}
	return nil
}

// DestroyCQ destroys the CQ. It fails while QPs use it and, as ibv_destroy_cq, waits
// until every event GetCQEvent returned for it was acknowledged.
func (cq *CQ) DestroyCQ() error {
	c := cq.ctx
	c.mu.Lock()
	if cq.dead {
		c.mu.Unlock()
		return fmt.Errorf("verbs: DestroyCQ: %w", ErrClosed)
	}
	if cq.users > 0 {
		c.mu.Unlock()
		return fmt.Errorf("verbs: DestroyCQ: %w: %d QPs use the CQ", ErrBusy, cq.users)
	}
	cq.dead = true
	c.cqs--
	delete(c.cqSet, cq)
	c.mu.Unlock()
	cq.destroyed.Store(true)
	cq.cq.Stop()
	c.forgetCQ(cq)
	if cq.channel != nil {
		cq.channel.detach(cq)
	}
	cq.mu.Lock()
	for cq.acked < cq.taken {
		cq.cond.Wait()
	}
	cq.mu.Unlock()
	c.events.forget(cq)
	return nil
}

// CompChannel is a completion channel (ibv_comp_channel): armed CQs report events to it.
type CompChannel struct {
	ctx   *Device
	mu    sync.Mutex
	q     []*CQ
	ready chan struct{}
	gone  chan struct{} // closed by DestroyCompChannel: wakes every waiter
	cqs   int
	dead  bool
}

// CreateCompChannel creates a completion channel.
func (c *Device) CreateCompChannel() (*CompChannel, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.check(); err != nil {
		return nil, fmt.Errorf("verbs: CreateCompChannel: %w", err)
	}
	return &CompChannel{ctx: c, ready: make(chan struct{}, 1), gone: make(chan struct{})}, nil
}

func (ch *CompChannel) attach() error {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.dead {
		return fmt.Errorf("completion channel was destroyed: %w", ErrClosed)
	}
	ch.cqs++
	return nil
}

func (ch *CompChannel) detach(cq *CQ) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ch.cqs--
	kept := ch.q[:0]
	for _, x := range ch.q {
		if x != cq {
			kept = append(kept, x)
		}
	}
	clear(ch.q[len(kept):])
	ch.q = kept
}

// deliver queues an event for cq (called by the engine when an armed CQ fires).
func (ch *CompChannel) deliver(cq *CQ) {
	ch.mu.Lock()
	ch.q = append(ch.q, cq)
	ch.mu.Unlock()
	select {
	case ch.ready <- struct{}{}:
	default:
	}
}

// TryGetCQEvent returns the CQ of the next pending event, if any, without waiting.
func (ch *CompChannel) TryGetCQEvent() (*CQ, bool) {
	ch.mu.Lock()
	if len(ch.q) == 0 {
		ch.mu.Unlock()
		return nil, false
	}
	cq := ch.q[0]
	n := copy(ch.q, ch.q[1:]) // shifted in place: the queue keeps its storage (no allocation per event)
	ch.q[n] = nil
	ch.q = ch.q[:n]
	if len(ch.q) > 0 {
		select {
		case ch.ready <- struct{}{}:
		default:
		}
	}
	ch.mu.Unlock()
	cq.mu.Lock()
	cq.taken++
	cq.mu.Unlock()
	return cq, true
}

// Ready returns a channel that holds a value while an event may be waiting, for a
// program that waits for several things in one select, as a C program polls the
// channel's file descriptor with others: on receiving from it, take the events with
// TryGetCQEvent (which leaves a value again while more wait). A value may be stale: an
// event another goroutine took meanwhile.
func (ch *CompChannel) Ready() <-chan struct{} { return ch.ready }

// GetCQEvent waits for the next event and returns its CQ. The CQ must be re-armed with
// ReqNotifyCQ for another event, and the event acknowledged with AckCQEvents.
func (ch *CompChannel) GetCQEvent(ctx context.Context) (*CQ, error) {
	for {
		if cq, ok := ch.TryGetCQEvent(); ok {
			return cq, nil
		}
		ch.mu.Lock()
		dead := ch.dead
		ch.mu.Unlock()
		if dead {
			return nil, fmt.Errorf("verbs: GetCQEvent: the completion channel was destroyed: %w", ErrClosed)
		}
		if ch.ctx.isClosed() {
			return nil, fmt.Errorf("verbs: GetCQEvent: %w", ErrClosed)
		}
		select {
		case <-ch.ready:
		case <-ch.gone:
		case <-ch.ctx.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// DestroyCompChannel destroys the channel; it fails while CQs use it.
func (ch *CompChannel) DestroyCompChannel() error {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.dead {
		return fmt.Errorf("verbs: DestroyCompChannel: %w", ErrClosed)
	}
	if ch.cqs > 0 {
		return fmt.Errorf("verbs: DestroyCompChannel: %w: %d CQs use the channel", ErrBusy, ch.cqs)
	}
	ch.dead = true
	close(ch.gone)
	return nil
}

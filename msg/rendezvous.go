package msg

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrRefused is wrapped by Init's error when rank 0's rendezvous refused this rank: it
// serves another job (Config.Job differs: two jobs were given one SOFTRNIC_ROOT), a job
// of another size, or has heard from this rank already.
var ErrRefused = errors.New("refused by rank 0's rendezvous")

// The rendezvous gives every rank every rank's device address: rank 0 listens on the
// job's root address (TCP), every other rank connects to it (retrying until rank 0 is
// up) and sends a report, and rank 0 answers each, once all have reported, with the
// address book and the job's wire ID (the number connections carry in their private
// data). A report from a rank of another job, of a job of another size, or of a rank
// already reported is answered at once with the reason, and that rank's Init fails; rank
// 0 goes on waiting for its own ranks. Everything ends within Config.RendezvousTimeout:
// rank 0 then tells the ranks that reported which ones never came.

// rvReport is what a rank sends rank 0.
type rvReport struct {
	Rank int    `json:"rank"`
	Size int    `json:"size"`
	Job  string `json:"job"`
	Dev  string `json:"dev"`
}

// rvAnswer is rank 0's answer: the address book and the wire ID, or why there is none
// (Refused: why this rank was refused; Failed: why the rendezvous failed).
type rvAnswer struct {
	Book    []string `json:"book,omitempty"`
	Wire    uint64   `json:"wire,omitempty"`
	Refused string   `json:"refused,omitempty"`
	Failed  string   `json:"failed,omitempty"`
}

// rvIOTimeout bounds reading one report and writing one answer.
const rvIOTimeout = 10 * time.Second

// maxReport bounds what rank 0 reads of a report (a job identity of a few hundred bytes
// at most, an address), and maxAnswer what a rank reads of rank 0's answer: whatever a
// stray or hostile client sends costs no more memory than that.
const maxReport = 4 << 10

func maxAnswer(size int) int64 { return 8<<10 + 64*int64(size) }

// rendezvous is one rank's part in its job's rendezvous.
type rendezvous struct {
	rank, size int
	job        string
	root       string
	dev        netip.AddrPort
	timeout    time.Duration

	// Tests' hooks: arrived is told each rank whose report rank 0 has counted, and
	// expire, if set, stands in for rank 0's timer.
	arrived func(rank int)
	expire  <-chan time.Time
}

// exchange runs the rendezvous and returns the address book and the wire ID (rank 0's
// wire, which it offers, or the one rank 0 sends). On rank 0 the rendezvous stays open
// until stop is called (the rank's Close), refusing every report that comes after its
// ranks have all come; stop is a no-op elsewhere.
func (rv *rendezvous) exchange(ctx context.Context, wire uint64) (book []netip.AddrPort, _ uint64, stop func(), err error) {
	stop = func() {}
	if rv.size == 1 {
		return []netip.AddrPort{rv.dev}, wire, stop, nil
	}
	if rv.rank == 0 {
		book, stop, err = rv.serve(ctx, wire)
		return book, wire, stop, err
	}
	book, wire, err = rv.report(ctx)
	return book, wire, stop, err
}

// rvArrival is a report read from a connection (or why it could not be read).
type rvArrival struct {
	c   net.Conn
	r   rvReport
	err error
}

// serve is rank 0's part: wait for every other rank's report, then answer all. Once it
// has, it goes on refusing reports (a rank of another job given the same root, which
// would otherwise wait for its deadline or find the connection closed) until stop.
func (rv *rendezvous) serve(ctx context.Context, wire uint64) (_ []netip.AddrPort, stop func(), _ error) {
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", rv.root)
	if err != nil {
		hint := ""
		if errors.Is(err, syscall.EADDRINUSE) {
			hint = " (another program, perhaps another job's rank 0, serves that port: give each job its own SOFTRNIC_ROOT port, or a host alone to take one from the job's identity)"
		}
		return nil, nil, fmt.Errorf("msg: rank 0 serving the rendezvous on %s: %w%s", rv.root, err, hint)
	}
	expire := rv.expire
	if expire == nil {
		t := time.NewTimer(rv.timeout)
		defer t.Stop()
		expire = t.C
	}
	// The accept loop outlives Init's context when the rendezvous succeeds: it ends with
	// stop, or here when the rendezvous fails.
	open, cancel := context.WithCancel(context.Background())
	end := func() { cancel(); l.Close() } // the port is free when end returns
	succeeded := false
	defer func() {
		if !succeeded {
			end()
		}
	}()
	arrivals := make(chan rvArrival)
	go rvAccept(open, l, arrivals)

	book := make([]netip.AddrPort, rv.size)
	book[0] = rv.dev
	conns := make([]net.Conn, rv.size)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	var refused []string
	for n := 1; n < rv.size; {
		select {
		case a := <-arrivals:
			if a.err != nil {
				a.c.Close() // not a rank's report: a stray connection
				continue
			}
			why, dev := rv.check(a.r, conns)
			if why != "" {
				refused = append(refused, fmt.Sprintf("rank %d of job %q (of %d ranks) from %s", a.r.Rank, a.r.Job, a.r.Size, a.c.RemoteAddr()))
				rvAnswerTo(a.c, rvAnswer{Refused: "rank 0 at " + rv.root + " " + why})
				a.c.Close()
				continue
			}
			book[a.r.Rank], conns[a.r.Rank] = dev, a.c
			n++
			if rv.arrived != nil {
				rv.arrived(a.r.Rank)
			}
		case <-expire:
			why := fmt.Sprintf("%s of %d never reported within %v", rankList(missing(conns)), rv.size, rv.timeout)
			return nil, nil, rv.fail(conns, refused, why, fmt.Errorf("msg: rank 0: the rendezvous at %s: %s: %w", rv.root, why, context.DeadlineExceeded))
		case <-ctx.Done():
			why := fmt.Sprintf("%s of %d had not reported when rank 0 was cancelled", rankList(missing(conns)), rv.size)
			return nil, nil, rv.fail(conns, refused, why, fmt.Errorf("msg: rank 0: the rendezvous at %s: %w (%s)", rv.root, ctx.Err(), why))
		}
	}
	answer := rvAnswer{Book: make([]string, rv.size), Wire: wire}
	for i, a := range book {
		answer.Book[i] = a.String()
	}
	for r, c := range conns[1:] {
		if err := rvAnswerTo(c, answer); err != nil {
			return nil, nil, fmt.Errorf("msg: rank 0: the rendezvous at %s: sending rank %d the address book: %w", rv.root, r+1, err)
		}
	}
	succeeded = true
	go rv.refuseLate(open, arrivals)
	return book, end, nil
}

// refuseLate answers every report that arrives after the rendezvous, until open ends.
func (rv *rendezvous) refuseLate(open context.Context, arrivals <-chan rvArrival) {
	for {
		select {
		case a := <-arrivals:
			if a.err == nil {
				rvAnswerTo(a.c, rvAnswer{Refused: fmt.Sprintf("rank 0 at %s serves job %q, whose %d ranks have all come (rank %d of job %q is not one of them)",
					rv.root, rv.job, rv.size, a.r.Rank, a.r.Job)})
			}
			a.c.Close()
		case <-open.Done():
			return
		}
	}
}

// missing lists the ranks (but 0) that have no connection in conns.
func missing(conns []net.Conn) []int {
	var m []int
	for r := 1; r < len(conns); r++ {
		if conns[r] == nil {
			m = append(m, r)
		}
	}
	return m
}

// fail ends a rendezvous that rank 0 gives up: it tells the ranks that reported why, and
// returns err with the refusals it made added.
func (rv *rendezvous) fail(conns []net.Conn, refused []string, why string, err error) error {
	for _, c := range conns {
		if c != nil {
			rvAnswerTo(c, rvAnswer{Failed: "rank 0 at " + rv.root + ": " + why})
		}
	}
	if len(refused) > 0 {
		err = fmt.Errorf("%w; refused: %s", err, strings.Join(refused, "; "))
	}
	return err
}

// check says why rank 0 refuses the report r ("" if it does not) and the device address
// it gives.
func (rv *rendezvous) check(r rvReport, conns []net.Conn) (why string, dev netip.AddrPort) {
	switch {
	case r.Job != rv.job:
		return fmt.Sprintf("serves job %q, not rank %d's job %q", rv.job, r.Rank, r.Job), dev
	case r.Size != rv.size:
		return fmt.Sprintf("serves a job of %d ranks, not rank %d's job of %d", rv.size, r.Rank, r.Size), dev
	case r.Rank <= 0 || r.Rank >= rv.size:
		return fmt.Sprintf("has no rank %d in a job of %d ranks", r.Rank, rv.size), dev
	case conns[r.Rank] != nil:
		return fmt.Sprintf("has heard from rank %d already (from %s)", r.Rank, conns[r.Rank].RemoteAddr()), dev
	}
	dev, err := netip.ParseAddrPort(r.Dev)
	if err != nil {
		return fmt.Sprintf("cannot read rank %d's device address %q", r.Rank, r.Dev), dev
	}
	return "", dev
}

// rvAccept accepts connections on l until it is closed, reading each one's report in a
// goroutine of its own (a silent connection holds up no other), and hands the reports to
// arrivals while ctx lasts.
func rvAccept(ctx context.Context, l net.Listener, arrivals chan<- rvArrival) {
	context.AfterFunc(ctx, func() { l.Close() })
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			var a rvArrival
			a.c = c
			c.SetReadDeadline(time.Now().Add(rvIOTimeout))
			a.err = json.NewDecoder(io.LimitReader(c, maxReport)).Decode(&a.r)
			c.SetReadDeadline(time.Time{})
			select {
			case arrivals <- a:
			case <-ctx.Done():
				c.Close()
			}
		}()
	}
}

// rvAnswerTo writes a to c, bounded by rvIOTimeout.
func rvAnswerTo(c net.Conn, a rvAnswer) error {
	c.SetWriteDeadline(time.Now().Add(rvIOTimeout))
	return json.NewEncoder(c).Encode(a)
}

// report is the part of every rank but 0: report to rank 0, wait for its answer.
func (rv *rendezvous) report(ctx context.Context) ([]netip.AddrPort, uint64, error) {
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, rv.timeout)
	defer cancel()
	// fail says what did not happen in time, and why it may not have (hint, or "").
	fail := func(what, hint string) error {
		if hint != "" {
			hint = " (" + hint + ")"
		}
		if err := parent.Err(); err != nil {
			return fmt.Errorf("msg: rank %d: %s%s: %w", rv.rank, what, hint, err)
		}
		return fmt.Errorf("msg: rank %d: %s within %v%s: %w", rv.rank, what, rv.timeout, hint, context.DeadlineExceeded)
	}
	var c net.Conn
	var d net.Dialer
	retry := time.NewTimer(0)
	defer retry.Stop()
	for {
		var err error
		if c, err = d.DialContext(ctx, "tcp", rv.root); err == nil {
			break
		}
		retry.Reset(20 * time.Millisecond) // rank 0 may not be listening yet
		select {
		case <-ctx.Done():
			return nil, 0, fail(fmt.Sprintf("rank 0's rendezvous at %s did not answer", rv.root), "is rank 0 running, with the same SOFTRNIC_ROOT?")
		case <-retry.C:
		}
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	if err := json.NewEncoder(c).Encode(rvReport{Rank: rv.rank, Size: rv.size, Job: rv.job, Dev: rv.dev.String()}); err != nil {
		if ctx.Err() != nil {
			return nil, 0, fail(fmt.Sprintf("reporting to rank 0 at %s", rv.root), "")
		}
		return nil, 0, fmt.Errorf("msg: rank %d: reporting to rank 0 at %s: %w", rv.rank, rv.root, err)
	}
	var a rvAnswer
	if err := json.NewDecoder(io.LimitReader(c, maxAnswer(rv.size))).Decode(&a); err != nil {
		if ctx.Err() != nil {
			return nil, 0, fail(fmt.Sprintf("rank 0 at %s sent no address book", rv.root), "it waits for other ranks")
		}
		return nil, 0, fmt.Errorf("msg: rank %d: rank 0 at %s closed the rendezvous without answering (its job ended?): %w", rv.rank, rv.root, err)
	}
	switch {
	case a.Refused != "":
		return nil, 0, fmt.Errorf("msg: rank %d of job %q: %w: %s", rv.rank, rv.job, ErrRefused, a.Refused)
	case a.Failed != "":
		return nil, 0, fmt.Errorf("msg: rank %d: the rendezvous failed: %s", rv.rank, a.Failed)
	case len(a.Book) != rv.size:
		return nil, 0, fmt.Errorf("msg: rank %d: rank 0 at %s sent an address book of %d ranks, want %d", rv.rank, rv.root, len(a.Book), rv.size)
	}
	book := make([]netip.AddrPort, rv.size)
	for i, s := range a.Book {
		var err error
		if book[i], err = netip.ParseAddrPort(s); err != nil {
			return nil, 0, fmt.Errorf("msg: rank %d: rank 0 at %s sent a bad address for rank %d: %q", rv.rank, rv.root, i, s)
		}
	}
	return book, a.Wire, nil
}

// rankList writes ranks (ascending) as "rank 3" or "ranks 1, 4-6".
func rankList(ranks []int) string {
	var b strings.Builder
	for i := 0; i < len(ranks); {
		j := i
		for j+1 < len(ranks) && ranks[j+1] == ranks[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Itoa(ranks[i]))
		if j > i {
			b.WriteString("-" + strconv.Itoa(ranks[j]))
		}
		i = j + 1
	}
	if len(ranks) == 1 {
		return "rank " + b.String()
	}
	return "ranks " + b.String()
}

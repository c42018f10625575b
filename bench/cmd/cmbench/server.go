package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/verbs"
)

// The listener side: one device, one PD, one CQ, one SRQ shared by every QP; each
// request gets a new RC QP on the SRQ and its own goroutine for Accept. The QPs of ended
// connections are destroyed when the client asks (drain), and once a second in any case
// (so that a listener started on its own serves any number of runs). It takes commands
// from the client on stdin and answers with one JSON line each:
//
//	{"addr":"127.0.0.2:40123"}        once, when it listens
//	collect N  → serverReport        after the parent's N Dials succeeded: wait for N accepts
//	drain      → serverReport        after the parent disconnected everything: wait for every
//	                                 connection to end and its QP to go, start a new round

// serverReport is what the listener tells the parent about one round.
type serverReport struct {
	Established   int    `json:"established"` // Accepts that returned a connection
	Failed        int    `json:"failed"`      // Accepts that returned an error
	FirstError    string `json:"first_error,omitempty"`
	Pending       int    `json:"pending"`        // Accepts still waiting when it answered
	Ended         int    `json:"ended"`          // connections whose Done closed
	Destroyed     int    `json:"destroyed"`      // QPs destroyed (of ended connections and failed Accepts)
	CMEstablished uint64 `json:"cm_established"` // cm.Counters: the round's delta
	REQDuplicates uint64 `json:"req_duplicates"`
	MRASent       uint64 `json:"mra_sent"`
	REPRetries    uint64 `json:"rep_retries"`
	REJSent       uint64 `json:"rej_sent"`
	BacklogDrops  uint64 `json:"backlog_drops"`
	StaleRejects  uint64 `json:"stale_rejects"`
	DREPSent      uint64 `json:"drep_sent"`
	CMDropped     uint64 `json:"cm_dropped"`
	SendErrors    uint64 `json:"send_errors"`
	DevDropped    uint64 `json:"dev_dropped"` // device counters: datagrams dropped (QP1 receive queue empty among them)
	TimedOut      bool   `json:"timed_out,omitempty"`
}

// server is the listener and its round's state.
type server struct {
	dev *verbs.Device
	pd  *verbs.PD
	cq  *verbs.CQ
	srq *verbs.SRQ
	l   *cm.Listener

	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every change of the counts below
	pending int           // Accepts still waiting
	cur     *round
	base    cm.Counters
	baseDev verbs.Counters
}

// round counts one round's connections.
type round struct {
	ok, fail  int
	firstErr  string
	live      []accepted // accepted connections whose QP is not destroyed yet
	ended     int        // accepted connections that ended and whose QP was destroyed
	destroyed int        // QPs destroyed: of ended connections and of failed Accepts
}

type accepted struct {
	qp   *verbs.QP
	conn *cm.Conn
}

// reap destroys the QPs of the round's connections that ended (mu held). (A goroutine
// per connection waiting for its end would do it at once, but 10,000 parked goroutines
// cost the garbage collector enough to slow connection setup by 15-20%.)
func (rd *round) reap() {
	kept := rd.live[:0]
	for _, a := range rd.live {
		select {
		case <-a.conn.Done():
			rd.ended++
			if a.qp.DestroyQP() == nil {
				rd.destroyed++
			}
		default:
			kept = append(kept, a)
		}
	}
	clear(rd.live[len(kept):])
	rd.live = kept
}

const srqRecvs = 64

func newServer(dev *verbs.Device, service uint16) (*server, error) {
	s := &server{dev: dev, changed: make(chan struct{}), cur: &round{}}
	var err error
	if s.pd, err = dev.AllocPD(); err != nil {
		return nil, err
	}
	if s.cq, err = dev.CreateCQ(64, nil, 0); err != nil {
		return nil, err
	}
	if s.srq, err = s.pd.CreateSRQ(&verbs.SRQInitAttr{MaxWR: 2 * srqRecvs, MaxSGE: 1}); err != nil {
		return nil, err
	}
	// Receives in the SRQ before anything connects, as an application posts them
	// (nothing is sent in this benchmark, so they stay there).
	buf := make([]byte, srqRecvs*256)
	mr, err := s.pd.RegMR(buf, verbs.AccessLocalWrite)
	if err != nil {
		return nil, err
	}
	wrs := make([]verbs.RecvWR, srqRecvs)
	for i := range wrs {
		wrs[i] = verbs.RecvWR{WRID: uint64(i), SGList: []verbs.SGE{mr.SGE(i*256, 256)}}
	}
	if err := s.srq.PostSRQRecv(wrs); err != nil {
		return nil, err
	}
	if s.l, err = cm.Listen(dev, service); err != nil {
		return nil, err
	}
	s.base, s.baseDev = cm.DeviceCounters(dev), dev.Counters()
	return s, nil
}

// run accepts requests until ctx ends or the listener is closed.
func (s *server) run(ctx context.Context) {
	// Every QP on the SRQ that goes to ERR raises "last WQE reached": take and
	// acknowledge the events, as an application does, so that they do not pile up.
	go func() {
		for {
			ev, err := s.dev.GetAsyncEvent(ctx)
			if err != nil {
				return
			}
			s.dev.AckAsyncEvent(ev)
		}
	}()
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				s.mu.Lock()
				s.cur.reap()
				s.mu.Unlock()
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		r, err := s.l.Accept(ctx)
		if err != nil {
			return
		}
		s.update(func() { s.pending++ })
		qp, err := s.pd.CreateQP(&verbs.QPInitAttr{SendCQ: s.cq, RecvCQ: s.cq, SRQ: s.srq,
			Cap: verbs.QPCap{MaxSendWR: 4, MaxSendSGE: 1}})
		if err != nil {
			_ = r.Reject([]byte("no QP"))
			s.update(func() { s.pending--; s.cur.failed(err) })
			continue
		}
		go func() {
			c, err := r.Accept(qp, &cm.AcceptParams{Options: verbs.ConnectOptions{Ordering: r.Ordering}})
			if err != nil {
				d := qp.DestroyQP() == nil
				s.update(func() {
					s.pending--
					s.cur.failed(err)
					if d {
						s.cur.destroyed++
					}
				})
				return
			}
			s.update(func() {
				s.pending--
				s.cur.ok++
				s.cur.live = append(s.cur.live, accepted{qp, c})
			})
		}()
	}
}

func (rd *round) failed(err error) {
	rd.fail++
	if rd.firstErr == "" {
		rd.firstErr = err.Error()
	}
}

// update changes the round's counts under mu and wakes waiters.
func (s *server) update(f func()) {
	s.mu.Lock()
	f()
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

// waitFor waits until cond (called with mu held) holds, or until the deadline; it
// reports whether cond held.
func (s *server) waitFor(d time.Duration, cond func() bool) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		s.mu.Lock()
		ok, ch := cond(), s.changed
		s.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-ch:
		case <-t.C:
			return false
		}
	}
}

// report fills the round's counts (mu held).
func (s *server) report() serverReport {
	c, d := cm.DeviceCounters(s.dev), s.dev.Counters()
	b, rd := s.base, s.cur
	return serverReport{Established: rd.ok, Failed: rd.fail, FirstError: rd.firstErr, Pending: s.pending,
		Ended: rd.ended, Destroyed: rd.destroyed,
		CMEstablished: c.Established - b.Established, REQDuplicates: c.REQDuplicates - b.REQDuplicates,
		MRASent: c.MRASent - b.MRASent, REPRetries: c.REPRetries - b.REPRetries, REJSent: c.REJSent - b.REJSent,
		BacklogDrops: c.BacklogDrops - b.BacklogDrops, StaleRejects: c.StaleRejects - b.StaleRejects,
		DREPSent: c.DREPSent - b.DREPSent, CMDropped: c.Dropped - b.Dropped, SendErrors: c.SendErrors - b.SendErrors,
		DevDropped: d.Dropped - s.baseDev.Dropped}
}

// collect waits until n connections were accepted and no Accept is still waiting.
func (s *server) collect(n int, limit time.Duration) serverReport {
	ok := s.waitFor(limit, func() bool { return s.cur.ok >= n && s.pending == 0 })
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.report()
	r.TimedOut = !ok
	return r
}

// drain waits until every connection of the round ended (the client disconnected them
// all), destroys their QPs and starts a new round.
func (s *server) drain(limit time.Duration) serverReport {
	ok := s.waitFor(limit, func() bool { return s.pending == 0 })
	s.mu.Lock()
	live := slices.Clone(s.cur.live)
	s.mu.Unlock()
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
wait:
	for _, a := range live {
		select {
		case <-a.conn.Done():
		case <-deadline.C:
			ok = false
			break wait
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cur.reap()
	r := s.report()
	r.TimedOut = !ok
	s.cur = &round{}
	s.base, s.baseDev = cm.DeviceCounters(s.dev), s.dev.Counters()
	return r
}

// serve runs the listener side: it opens the device, listens, says where on out, and
// answers the parent's commands from in until in ends.
func serve(o *options, in io.Reader, out io.Writer) error {
	addr, err := netip.ParseAddr(o.addr)
	if err != nil {
		return fmt.Errorf("-addr: %w", err)
	}
	dev, err := verbs.OpenDevice(verbs.DeviceConfig{Addr: addr, Port: devicePort(o.port)})
	if err != nil {
		return err
	}
	defer dev.Close()
	s, err := newServer(dev, uint16(o.service))
	if err != nil {
		return err
	}
	defer s.l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.run(ctx)
	enc := json.NewEncoder(out)
	if err := enc.Encode(map[string]string{"addr": dev.Addr().String()}); err != nil {
		return err
	}
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		var r serverReport
		switch {
		case f[0] == "collect" && len(f) == 2:
			n, err := strconv.Atoi(f[1])
			if err != nil {
				return fmt.Errorf("bad command %q", sc.Text())
			}
			r = s.collect(n, o.waitLimit)
		case f[0] == "drain":
			r = s.drain(o.waitLimit)
		default:
			return fmt.Errorf("bad command %q", sc.Text())
		}
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return sc.Err()
}

func devicePort(p int) int {
	if p == 0 {
		return verbs.AnyPort
	}
	return p
}

package perf

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/verbs"
)

// clientRole runs the measuring side.
func clientRole(s *side, peer Info) (Result, error) {
	switch s.cfg.Test {
	case "write_bw", "read_bw", "send_bw", "atomic_bw":
		return runBWClient(s, peer)
	case "send_lat", "write_lat":
		return runPingPong(s, peer, true)
	default:
		return runOneSided(s, peer)
	}
}

// serverRole runs the other side until the test is over; done is closed when the client
// has finished.
func serverRole(s *side, peer Info, done <-chan struct{}) error {
	switch s.cfg.Test {
	case "send_bw":
		return runSendBWServer(s)
	case "send_lat", "write_lat":
		_, err := runPingPong(s, peer, false)
		return err
	}
	<-done
	switch {
	case s.cfg.Test == "write_bw" && s.cfg.Check:
		return checkWriteBW(s)
	case s.cfg.Test == "atomic_bw" && s.cfg.Check:
		return checkAtomicBW(s)
	}
	return nil
}

func prepare(s *side) error {
	if isBW(s.cfg.Test) {
		return prepareBWServer(s)
	}
	return prepareLat(s)
}

// RunLoopback runs one test with both sides in this process, on devices at addrs[0]
// (client) and addrs[1] (server). With stats the result carries both devices' counters.
// With c.Perftest it is PerftestLoopback's client's last result.
func RunLoopback(c Config, addrs [2]netip.Addr, stats bool) (Result, error) {
	if c.Perftest {
		rs, _, err := PerftestLoopback(c, addrs, stats)
		if err != nil || len(rs) == 0 {
			return Result{}, err
		}
		return rs[len(rs)-1], nil
	}
	c.Defaults()
	if err := c.Validate(); err != nil {
		return Result{}, err
	}
	cs, err := newSide(&c, nil, addrs[0], verbs.AnyPort, c.Capture)
	if err != nil {
		return Result{}, err
	}
	defer cs.close()
	ss, err := newSide(&c, nil, addrs[1], verbs.AnyPort, nil)
	if err != nil {
		return Result{}, err
	}
	defer ss.close()
	if c.CM {
		// Receives are posted (prepare) in INIT, before the handshake.
		for _, s := range []*side{ss, cs} {
			if err := s.initQPs(); err != nil {
				return Result{}, err
			}
		}
	} else {
		if err := ss.connect(cs.info()); err != nil {
			return Result{}, err
		}
		if err := cs.connect(ss.info()); err != nil {
			return Result{}, err
		}
	}
	for _, s := range []*side{ss, cs} {
		if !isBW(c.Test) || s == ss {
			if err := prepare(s); err != nil {
				return Result{}, err
			}
		}
	}
	if c.CM {
		if err := connectCM(cs, ss); err != nil {
			return Result{}, err
		}
	}
	done := make(chan struct{})
	errc := make(chan error, 1)
	var samples []<-chan *HoleSample
	if stats && c.Ordering == verbs.OrderingWeak {
		samples = append(samples, cs.sampleHoles("client", done), ss.sampleHoles("server", done))
	}
	go func() { errc <- serverRole(ss, cs.info(), done) }()
	r, cerr := clientRole(cs, ss.info())
	r.Ordering, r.CM = cs.ordering(), c.CM
	close(done)
	for _, sc := range samples {
		if h := <-sc; h != nil {
			r.Holes = append(r.Holes, *h)
		}
	}
	var serr error
	if cerr == nil {
		serr = <-errc
	} else {
		// The server may wait for messages that will never come; closing the devices
		// (deferred) ends it.
		select {
		case serr = <-errc:
		case <-time.After(100 * time.Millisecond):
		}
	}
	// The client side disconnects (with the CM), as rdma_disconnect after a perftest run.
	derr := cs.disconnect()
	if err := errors.Join(cerr, serr, derr); err != nil {
		return Result{}, err
	}
	if stats {
		r.Counters = &Stats{Client: cs.ctx.Counters(), Server: ss.ctx.Counters()}
	}
	return r, nil
}

// DefaultControlPort is the TCP port of the control connection, as perftest's.
const DefaultControlPort = 18515

// Control messages, one JSON object per line.
type hello struct {
	Config Config `json:"config"`
	Info   Info   `json:"info"`
}

type reply struct {
	Info     Info            `json:"info"`
	CM       *cmListen       `json:"cm,omitempty"`
	Err      string          `json:"err,omitempty"`
	Counters *verbs.Counters `json:"counters,omitempty"`
}

// cmListen is where the server's connection manager listens (with Config.CM): its device's
// address and UDP port (devices in tests have ephemeral ports), and the service port.
type cmListen struct {
	Device  netip.AddrPort `json:"device"`
	Service uint16         `json:"service"`
}

// cmMismatch explains a client and a server that disagree on --cm.
func cmMismatch(client bool) error {
	if client {
		return errors.New("the client connects its QPs with --cm, this server does not: run both sides with --cm, or neither")
	}
	return errors.New("this server connects QPs with --cm, the client does not: run both sides with --cm, or neither")
}

// ServeOnce listens on ctlAddr for one client, runs the test it asks for (which must be
// own.Test) and returns the client's result. own is the server's side of the
// configuration: its fault injection, the ordering it offers, whether the QPs are
// connected through the connection manager (its devices then open and listen before any
// client comes, see NewServer; the client must use --cm too), and, when set, its receive
// goroutines' busy-poll time and its receive queues (otherwise the client's queues,
// without --cm). The device binds to devAddr, or to the address the client connected to
// if devAddr is not valid. A client that speaks perftest's exchange is served in
// perftest mode (Serve); the result is then the last one this side reports (none: the
// zero Result).
func ServeOnce(own Config, ctlAddr string, devAddr netip.Addr, stats bool, ready func(net.Addr)) (Result, error) {
	rs, err := Serve(own, ctlAddr, devAddr, stats, ready)
	if err != nil || len(rs) == 0 {
		return Result{}, err
	}
	return rs[len(rs)-1], nil
}

// serveRperf serves an rperf client in rperf's own mode on conn (read through br), with
// the device opened up front (dev, with --cm) or one at devAddr.
func serveRperf(own Config, conn net.Conn, br *bufio.Reader, devAddr netip.Addr, stats bool, ctlPort uint16, dev *serverDev) (Result, error) {
	test, faults, ordering, useCM := own.Test, own.Faults, own.Ordering, own.CM
	enc, dec := json.NewEncoder(conn), json.NewDecoder(br)
	var h hello
	if err := dec.Decode(&h); err != nil {
		return Result{}, fmt.Errorf("control: %w", err)
	}
	fail := func(err error) (Result, error) {
		_ = enc.Encode(reply{Err: err.Error()})
		return Result{}, err
	}
	c := h.Config
	c.Ordering = ordering
	if c.Test != test {
		return fail(fmt.Errorf("client asked for %s, this server runs %s", c.Test, test))
	}
	if c.CM != useCM {
		return fail(cmMismatch(c.CM))
	}
	c.Faults = faults
	c.BusyPoll = own.BusyPoll
	c.Metrics = own.Metrics
	if own.Queues != 0 {
		c.Queues = own.Queues
	}
	if err := c.Validate(); err != nil {
		return fail(err)
	}
	var ctx *verbs.Device
	var base verbs.Counters
	if dev != nil {
		ctx, base = dev.ctx, dev.ctx.Counters()
	}
	s, err := newSide(&c, ctx, devAddr, verbs.AnyPort, nil)
	if err != nil {
		return fail(err)
	}
	defer s.close()
	var l *cm.Listener
	switch {
	case dev != nil:
		// Listening since the server started. Receives are posted (prepare) in INIT,
		// before the handshake.
		l = dev.l
		if err := s.initQPs(); err != nil {
			return fail(err)
		}
	case useCM:
		// No device was opened up front at this address: listen before the reply tells
		// the client where, so that its first Dial finds the listener.
		if l, err = cm.Listen(s.ctx, ctlPort); err != nil {
			return fail(err)
		}
		defer l.Close()
		if err := s.initQPs(); err != nil {
			return fail(err)
		}
	default:
		if err := s.connect(h.Info); err != nil {
			return fail(err)
		}
	}
	if err := prepare(s); err != nil {
		return fail(err)
	}
	rep := reply{Info: s.info()}
	if l != nil {
		rep.CM = &cmListen{Device: s.ctx.Addr(), Service: l.Addr().Port()}
	}
	if err := enc.Encode(rep); err != nil {
		return Result{}, err
	}
	if l != nil {
		ctx, cancel := context.WithTimeout(context.Background(), cmSetupTimeout)
		err := s.acceptAll(ctx, l)
		cancel()
		if err != nil {
			// The client's Dial fails too (rejected, or no answer); it reports its own error.
			return Result{}, err
		}
	}
	// The client reports its result when it is done.
	done := make(chan struct{})
	var fin struct {
		Result Result `json:"result"`
		Err    string `json:"err"`
	}
	finErr := make(chan error, 1)
	go func() {
		err := dec.Decode(&fin)
		close(done)
		finErr <- err
	}()
	serr := serverRole(s, h.Info, done)
	if err := <-finErr; err != nil {
		return Result{}, fmt.Errorf("control: %w", err)
	}
	r := reply{}
	if serr != nil {
		r.Err = serr.Error()
	}
	if stats {
		k := countersSince(s.ctx.Counters(), base)
		r.Counters = &k
	}
	_ = enc.Encode(r)
	// The client disconnects once it has this reply; close disconnects what it did not.
	s.awaitDisconnect(cmAwaitDisconnect)
	if fin.Err != "" {
		return Result{}, errors.New("client: " + fin.Err)
	}
	return fin.Result, serr
}

// RunClient connects to the server at ctlAddr, runs the test and returns its result. The
// device binds to devAddr, or to the local address of the control connection. With
// c.Perftest it is PerftestClient's last result.
func RunClient(c Config, ctlAddr string, devAddr netip.Addr, stats bool) (Result, error) {
	if c.Perftest {
		rs, err := PerftestClient(c, ctlAddr, devAddr, stats)
		if err != nil || len(rs) == 0 {
			return Result{}, err
		}
		return rs[len(rs)-1], nil
	}
	c.Defaults()
	if err := c.Validate(); err != nil {
		return Result{}, err
	}
	conn, err := net.DialTimeout("tcp", ctlAddr, 10*time.Second)
	if err != nil {
		if c.CM && errors.Is(err, syscall.ECONNREFUSED) {
			err = fmt.Errorf("%w (a server of perftest's -R speaks nothing but rdma_cm: give the client --perftest too)", err)
		}
		return Result{}, err
	}
	defer conn.Close()
	defer shareHost(conn.RemoteAddr())()
	br := bufio.NewReader(conn)
	enc, dec := json.NewEncoder(conn), json.NewDecoder(br)
	if !devAddr.IsValid() {
		devAddr = conn.LocalAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	}
	s, err := newSide(&c, nil, devAddr, verbs.AnyPort, c.Capture)
	if err != nil {
		return Result{}, err
	}
	defer s.close()
	if err := enc.Encode(hello{Config: c, Info: s.info()}); err != nil {
		return Result{}, err
	}
	var rep reply
	if b, err := br.Peek(1); err == nil && b[0] >= '0' && b[0] <= '9' {
		// A perftest server (or rperf --perftest) took our hello for its version.
		return Result{}, errors.New("the server speaks perftest's exchange (a perftest tool, or rperf --perftest): run the client with --perftest")
	}
	if err := dec.Decode(&rep); err != nil {
		return Result{}, fmt.Errorf("control: %w", err)
	}
	if rep.Err != "" {
		return Result{}, errors.New("server: " + rep.Err)
	}
	switch {
	case c.CM && rep.CM == nil:
		return Result{}, errors.New("the server does not connect QPs with --cm (an older rperf?): run both sides with --cm, or neither")
	case c.CM:
		// Receives are posted (prepare) in INIT, before the handshake.
		if err := s.initQPs(); err != nil {
			return Result{}, err
		}
	default:
		if err := s.connect(rep.Info); err != nil {
			return Result{}, err
		}
	}
	if !isBW(c.Test) {
		if err := prepare(s); err != nil {
			return Result{}, err
		}
	}
	if c.CM {
		dev := rep.CM.Device.Addr()
		if dev.IsUnspecified() {
			dev = conn.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
		}
		ctx, cancel := context.WithTimeout(context.Background(), cmSetupTimeout)
		err := s.dialAll(ctx, netip.AddrPortFrom(dev, rep.CM.Service), rep.CM.Device.Port())
		cancel()
		if err != nil {
			return Result{}, err
		}
	}
	r, rerr := clientRole(s, rep.Info)
	r.Ordering, r.CM = s.ordering(), c.CM
	fin := struct {
		Result Result `json:"result"`
		Err    string `json:"err"`
	}{Result: r}
	if rerr != nil {
		fin.Err = rerr.Error()
	}
	if err := enc.Encode(fin); err != nil && rerr == nil {
		return Result{}, err
	}
	if rerr != nil {
		return Result{}, rerr
	}
	var last reply
	if err := dec.Decode(&last); err != nil {
		return Result{}, fmt.Errorf("control: %w", err)
	}
	if last.Err != "" {
		return Result{}, errors.New("server: " + last.Err)
	}
	if err := s.disconnect(); err != nil {
		return Result{}, err
	}
	if stats {
		r.Counters = &Stats{Client: s.ctx.Counters()}
		if last.Counters != nil {
			r.Counters.Server = *last.Counters
		}
	}
	return r, nil
}

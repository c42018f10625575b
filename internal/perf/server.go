package perf

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/verbs"
)

// Server serves one test to clients, one at a time. It waits on a TCP port: an rperf
// client in rperf's own mode (its first byte starts a JSON object), any other in
// perftest's exchange (perftest's tools, rperf --perftest). With Config.CM its devices
// are open from the start, each listening through the connection manager on the TCP
// port's number: a client of perftest's -R speaks nothing but rdma_cm (its first message
// is a ConnectRequest to that port at UDP 4791), and rperf's --cm clients connect their
// QPs there after the TCP exchange.
type Server struct {
	own     Config
	ln      net.Listener
	ctlPort uint16
	devAddr netip.Addr
	devs    []*serverDev
	// Skipped are the addresses where no device could be opened (with Config.CM and no
	// device address: one device per address of the host), and why.
	Skipped []error
}

// serverDev is a device a Server opened before any client came, and its listener.
type serverDev struct {
	ctx *verbs.Device
	l   *cm.Listener
}

// NewServer listens on ctlAddr (TCP). With own.CM it also opens the devices and listens
// on them: at devAddr if it is valid, else at ctlAddr's host if that names one, else at
// every address of the host's interfaces that are up (as rdma_cm's listener on the
// wildcard address takes requests from every device); on own.RoCEPort (0: 4791). Without
// own.CM a device is opened for each client, at devAddr or the address it connected to.
func NewServer(own Config, ctlAddr string, devAddr netip.Addr) (*Server, error) {
	ln, err := net.Listen("tcp", ctlAddr)
	if err != nil {
		return nil, err
	}
	s := &Server{own: own, ln: ln, ctlPort: uint16(ln.Addr().(*net.TCPAddr).Port), devAddr: devAddr}
	if !own.CM {
		return s, nil
	}
	addrs := []netip.Addr{devAddr}
	if !devAddr.IsValid() {
		if host, _, err := net.SplitHostPort(ctlAddr); err == nil && host != "" {
			if a, err := netip.ParseAddr(host); err == nil && !a.IsUnspecified() {
				addrs = []netip.Addr{a.Unmap()}
			}
		}
	}
	if !addrs[0].IsValid() {
		if addrs, err = hostAddrs(); err != nil {
			ln.Close()
			return nil, err
		}
	}
	port := own.RoCEPort
	if port == 0 {
		port = DefaultRoCEPort
	}
	for _, a := range addrs {
		dev, err := verbs.OpenDevice(verbs.DeviceConfig{Addr: a, Port: port, Queues: own.Queues, Faults: own.Faults,
			Window: own.Window, BusyPoll: own.BusyPoll})
		if err != nil {
			s.Skipped = append(s.Skipped, fmt.Errorf("no device at %v: %w", netip.AddrPortFrom(a, uint16(port)), err))
			continue
		}
		own.publish(dev)
		l, err := cm.Listen(dev, s.ctlPort)
		if err != nil {
			dev.Close()
			s.Skipped = append(s.Skipped, fmt.Errorf("no device at %v: %w", a, err))
			continue
		}
		s.devs = append(s.devs, &serverDev{ctx: dev, l: l})
	}
	if len(s.devs) == 0 {
		s.Close()
		return nil, fmt.Errorf("no device could be opened: %w", errors.Join(s.Skipped...))
	}
	return s, nil
}

// hostAddrs returns the addresses of the host's interfaces that are up, but link-local
// ones (a GID does not carry an IPv6 zone).
func hostAddrs() ([]netip.Addr, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagUp == 0 {
			continue
		}
		as, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range as {
			n, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			ip, ok := netip.AddrFromSlice(n.IP)
			if !ok || ip.Unmap().IsLinkLocalUnicast() || ip.IsMulticast() || slices.Contains(out, ip.Unmap()) {
				continue
			}
			out = append(out, ip.Unmap())
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no address on any interface that is up (give --dev-addr)")
	}
	return out, nil
}

// Addr is the TCP listener's address.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Devices are the devices opened up front (with Config.CM): their addresses and UDP
// ports. Their rdma_cm port is Addr's port.
func (s *Server) Devices() []netip.AddrPort {
	var out []netip.AddrPort
	for _, d := range s.devs {
		out = append(out, d.ctx.Addr())
	}
	return out
}

// Close stops listening and closes the devices.
func (s *Server) Close() error {
	err := s.ln.Close()
	for _, d := range s.devs {
		d.l.Close()
		d.ctx.Close()
	}
	s.devs = nil
	return err
}

// arrival is a client: a TCP connection, or a connection request at one of the devices.
type arrival struct {
	conn net.Conn
	req  *cm.Request
	dev  *serverDev
	err  error
}

// next waits for the next client, on the TCP port and, with Config.CM, at the devices.
func (s *Server) next() (arrival, error) {
	if len(s.devs) == 0 {
		conn, err := s.ln.Accept()
		return arrival{conn: conn}, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := make(chan arrival, 1+len(s.devs))
	var wg sync.WaitGroup
	wg.Add(1 + len(s.devs))
	go func() {
		defer wg.Done()
		conn, err := s.ln.Accept()
		ch <- arrival{conn: conn, err: err}
	}()
	for _, d := range s.devs {
		go func() {
			defer wg.Done()
			req, err := d.l.Accept(ctx)
			ch <- arrival{req: req, dev: d, err: err}
		}()
	}
	first := <-ch
	// The others stop: the TCP Accept at a deadline in the past, the listeners' with the
	// context; a client that came meanwhile is turned away (one client at a time).
	cancel()
	_ = s.ln.(*net.TCPListener).SetDeadline(time.Unix(1, 0))
	wg.Wait()
	_ = s.ln.(*net.TCPListener).SetDeadline(time.Time{})
	close(ch)
	for a := range ch {
		switch {
		case a.conn != nil:
			a.conn.Close()
		case a.req != nil:
			_ = a.req.Reject([]byte("rperf: busy with another client"))
		}
	}
	return first, first.err
}

// ServeOne waits for one client and runs the test with it. It returns the results this
// side reports: in rperf's mode the client's result; in perftest mode what perftest's
// server prints (see ptSession.run).
func (s *Server) ServeOne(stats bool) ([]Result, error) {
	a, err := s.next()
	if err != nil {
		return nil, err
	}
	if a.req != nil {
		// A request before any TCP connection: perftest's -R client (or rperf -R
		// --perftest) connecting its exchange's QP.
		if _, ok := cmIndex(a.req.PrivateData); ok {
			_ = a.req.Reject([]byte("rperf: no test in progress"))
			return nil, fmt.Errorf("a request from %v for an rperf --cm QP, but no test in progress", a.req.Remote)
		}
		if s.own.Ordering == verbs.OrderingWeak {
			_ = a.req.Reject(nil)
			return nil, errors.New("a perftest -R client: a standard peer has ordered mode only (no --ordering weak)")
		}
		c := s.own
		c.Perftest = true
		c.RoCEPort = int(a.dev.ctx.Addr().Port())
		c.Defaults()
		if err := c.Validate(); err != nil {
			_ = a.req.Reject(nil)
			return nil, err
		}
		defer shareHostAddr(a.req.Remote.Addr())()
		return perftestAcceptCM(&c, a.dev.ctx, a.dev.l, a.req, stats, nil)
	}
	conn := a.conn
	defer conn.Close()
	defer shareHost(conn.RemoteAddr())()
	br := bufio.NewReader(conn)
	perftest := s.own.Perftest
	if !perftest {
		// perftest's client writes its version first ("6.06"), rperf's a JSON object.
		_ = conn.SetReadDeadline(time.Now().Add(ptSetupTimeout))
		b, err := br.Peek(1)
		if err != nil {
			return nil, fmt.Errorf("control: %w", err)
		}
		_ = conn.SetReadDeadline(time.Time{})
		perftest = b[0] != '{'
	}
	local := conn.LocalAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	devAddr := s.devAddr
	if !devAddr.IsValid() {
		devAddr = local
	}
	dev := s.deviceFor(local)
	if !perftest {
		r, err := serveRperf(s.own, conn, br, devAddr, stats, s.ctlPort, dev)
		if err != nil {
			return nil, err
		}
		return []Result{r}, nil
	}
	c := s.own
	c.Perftest = true
	c.CM = false // perftest's exchange over TCP: no -R
	var ctx *verbs.Device
	if dev != nil {
		ctx = dev.ctx
		c.RoCEPort = int(ctx.Addr().Port())
	}
	c.Defaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return perftestConn(&c, conn, br, false, ctx, devAddr, stats)
}

// deviceFor returns the device opened up front for a client that connected to local: the
// one at devAddr if that was given, else the one at local's address (nil: none).
func (s *Server) deviceFor(local netip.Addr) *serverDev {
	for _, d := range s.devs {
		if a := d.ctx.Addr().Addr(); a == s.devAddr || !s.devAddr.IsValid() && a == local {
			return d
		}
	}
	return nil
}

// Serve listens on ctlAddr for one client and runs the test with it (NewServer,
// ServeOne). ready, if set, is called once the server listens (on TCP and, with own.CM,
// at its devices).
func Serve(own Config, ctlAddr string, devAddr netip.Addr, stats bool, ready func(net.Addr)) ([]Result, error) {
	s, err := NewServer(own, ctlAddr, devAddr)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	if ready != nil {
		ready(s.Addr())
	}
	return s.ServeOne(stats)
}

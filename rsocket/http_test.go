package rsocket_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/internal/verbstest"
	"github.com/softrnic/softrnic/rsocket"
	"github.com/softrnic/softrnic/verbs"
)

// httpRig is a net/http server on an rsocket listener of one device, and what its
// clients need to reach it from another device.
type httpRig struct {
	srv    *http.Server
	served chan error    // Serve's result
	closed chan struct{} // closed when the server closes its listener

	devC *verbs.Device
	dial rsocket.Dialer
	addr netip.AddrPort

	mu     sync.Mutex
	states map[http.ConnState]int // server connections that entered each state
}

// httpPort is the service port the test servers listen on.
const httpPort = 8080

// newHTTPRig opens two devices and serves handler over rsocket on one of them.
func newHTTPRig(t testing.TB, handler http.Handler) *httpRig {
	t.Helper()
	devS := verbstest.OpenDevice(t, verbstest.IPB, verbs.DeviceConfig{})
	devC := verbstest.OpenDevice(t, verbstest.IPA, verbs.DeviceConfig{})
	l, err := rsocket.Listen(devS, httpPort)
	if err != nil {
		t.Fatal(err)
	}
	r := &httpRig{
		served: make(chan error, 1),
		closed: make(chan struct{}),
		devC:   devC,
		dial:   rsocket.Dialer{DevicePort: devS.Addr().Port()},
		addr:   netip.AddrPortFrom(verbstest.IPB, httpPort),
		states: make(map[http.ConnState]int),
	}
	r.srv = &http.Server{
		Handler: handler,
		ConnState: func(_ net.Conn, s http.ConnState) {
			r.mu.Lock()
			r.states[s]++
			r.mu.Unlock()
		},
	}
	go func() { r.served <- r.srv.Serve(&notifyListener{Listener: l, closed: r.closed}) }()
	// A test that fails before shutdown still stops the server (a second Shutdown, after
	// the test's own, does nothing).
	t.Cleanup(func() { r.srv.Close() })
	return r
}

// notifyListener closes its channel when the listener is closed.
type notifyListener struct {
	*rsocket.Listener
	once   sync.Once
	closed chan struct{}
}

func (l *notifyListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// transport is an HTTP client transport (keep-alive on) whose every connection is an
// rsocket to the rig's server, whatever host the URL names. dials counts them.
func (r *httpRig) transport(dials *atomic.Int64) *http.Transport {
	return &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			if dials != nil {
				dials.Add(1)
			}
			return r.dial.Dial(ctx, r.devC, r.addr)
		},
		MaxIdleConnsPerHost: 16,
	}
}

// shutdown stops the server gracefully and closes the clients' idle connections, then
// checks that every connection the server took was closed and that no net/http
// goroutine (a server connection's or a client connection's read or write loop) is
// left.
func (r *httpRig) shutdown(t testing.TB, clients ...*http.Transport) {
	t.Helper()
	if err := r.srv.Shutdown(testutil.Context(t)); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := <-r.served; !errors.Is(err, http.ErrServerClosed) {
		t.Fatalf("Serve returned %v, want %v", err, http.ErrServerClosed)
	}
	for _, tr := range clients {
		tr.CloseIdleConnections()
	}
	// Shutdown closes idle connections itself; their goroutines then report them closed.
	verbstest.WaitUntil(t, "the server's connections to close and net/http's goroutines to end", func() bool {
		r.mu.Lock()
		opened, closed := r.states[http.StateNew], r.states[http.StateClosed]
		r.mu.Unlock()
		return closed == opened && len(httpGoroutines()) == 0
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.states[http.StateNew] == 0 {
		t.Errorf("the server took no connection")
	}
}

// httpGoroutines returns the stacks of the goroutines running net/http code.
func httpGoroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "net/http.") {
			out = append(out, g)
		}
	}
	return out
}

// dataHandler serves /data?n=N&seed=S with N bytes of testutil.Pattern(N, S) for a GET,
// and echoes a POST's body.
func dataHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /data", func(w http.ResponseWriter, req *http.Request) {
		n, err1 := strconv.Atoi(req.FormValue("n"))
		seed, err2 := strconv.ParseUint(req.FormValue("seed"), 10, 64)
		if err := errors.Join(err1, err2); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(n))
		w.Write(testutil.Pattern(n, seed))
	})
	mux.HandleFunc("POST /data", func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.Write(body)
	})
	return mux
}

// fetch sends a GET (body nil) or a POST of body and returns the response's body,
// which it reads to the end so that the connection is reused.
func fetch(ctx context.Context, c *http.Client, url string, body []byte) ([]byte, error) {
	method, rd := http.MethodGet, io.Reader(nil)
	if body != nil {
		method, rd = http.MethodPost, bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s %s: %s: %s", method, url, resp.Status, got)
	}
	return got, nil
}

// httpExchange makes one GET or POST of n bytes with the given seed and checks the bytes
// that come back.
func httpExchange(ctx context.Context, c *http.Client, post bool, n int, seed uint64) error {
	// The host name is arbitrary: the transport dials the rig's server whatever it is.
	url := fmt.Sprintf("http://softrnic.test/data?n=%d&seed=%d", n, seed)
	want := testutil.Pattern(n, seed)
	var body []byte
	if post {
		body = want
	}
	got, err := fetch(ctx, c, url, body)
	if err != nil {
		return err
	}
	if !bytes.Equal(got, want) {
		return fmt.Errorf("%s of %d bytes (seed %d): got %d bytes, equal prefix %d",
			map[bool]string{false: "GET", true: "POST"}[post], n, seed, len(got), commonPrefix(got, want))
	}
	return nil
}

// TestHTTP runs net/http over rsocket: GETs and POSTs of 0 B, 100 B and 1 MiB bodies,
// many requests on one kept-alive connection, several clients at once, and a graceful
// shutdown that leaves no connection or goroutine behind.
func TestHTTP(t *testing.T) {
	rig := newHTTPRig(t, dataHandler())
	ctx := testutil.Context(t)
	var transports []*http.Transport

	t.Run("sizes", func(t *testing.T) {
		var dials atomic.Int64
		tr := rig.transport(&dials)
		transports = append(transports, tr)
		c := &http.Client{Transport: tr}
		for _, n := range []int{0, 100, 1 << 20} {
			for _, post := range []bool{false, true} {
				if err := httpExchange(ctx, c, post, n, uint64(n)+1); err != nil {
					t.Fatal(err)
				}
			}
		}
		if d := dials.Load(); d != 1 {
			t.Errorf("%d connections dialled for sequential requests, want 1 (kept alive)", d)
		}
	})

	t.Run("keepalive", func(t *testing.T) {
		var dials atomic.Int64
		tr := rig.transport(&dials)
		transports = append(transports, tr)
		c := &http.Client{Transport: tr}
		requests := 200
		if testing.Short() {
			requests = 50
		}
		for i := range requests {
			if err := httpExchange(ctx, c, i%2 == 1, 1+i%300, uint64(i)); err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
		}
		if d := dials.Load(); d != 1 {
			t.Errorf("%d connections dialled for %d sequential requests, want 1", d, requests)
		}
	})

	t.Run("concurrent", func(t *testing.T) {
		const clients = 4
		requests := 50
		if testing.Short() {
			requests = 10
		}
		errs := make(chan error, clients)
		dials := make([]atomic.Int64, clients)
		for k := range clients {
			tr := rig.transport(&dials[k])
			transports = append(transports, tr)
			c := &http.Client{Transport: tr}
			go func() {
				for i := range requests {
					// Every tenth request moves 64 KiB, so that transfers overlap.
					n := 10 + k*7 + i
					if i%10 == 0 {
						n = 64 << 10
					}
					if err := httpExchange(ctx, c, i%2 == 0, n, uint64(k<<16|i)); err != nil {
						errs <- fmt.Errorf("client %d, request %d: %w", k, i, err)
						return
					}
				}
				errs <- nil
			}()
		}
		for range clients {
			if err := <-errs; err != nil {
				t.Error(err)
			}
		}
		for k := range clients {
			if d := dials[k].Load(); d != 1 {
				t.Errorf("client %d dialled %d connections for sequential requests, want 1", k, d)
			}
		}
	})

	rig.shutdown(t, transports...)
}

// TestHTTPShutdownActive shuts the server down while a client holds an idle kept-alive
// connection and another waits for a response: Shutdown lets the answer go out, closes
// both connections, and the clients see the idle connection closed.
func TestHTTPShutdownActive(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /slow", func(w http.ResponseWriter, req *http.Request) {
		close(entered)
		<-release
		io.WriteString(w, "done")
	})
	mux.Handle("/", dataHandler())
	rig := newHTTPRig(t, mux)
	ctx := testutil.Context(t)

	idle := rig.transport(nil)
	if err := httpExchange(ctx, &http.Client{Transport: idle}, false, 100, 1); err != nil {
		t.Fatal(err)
	}
	busy := rig.transport(nil)
	answer := make(chan error, 1)
	go func() {
		got, err := fetch(ctx, &http.Client{Transport: busy}, "http://softrnic.test/slow", nil)
		if err == nil && string(got) != "done" {
			err = fmt.Errorf("slow response %q, want %q", got, "done")
		}
		answer <- err
	}()
	<-entered
	shut := make(chan error, 1)
	go func() { shut <- rig.srv.Shutdown(ctx) }()
	// Shutdown has stopped listening and waits for the active request, which the
	// handler completes now.
	<-rig.closed
	close(release)
	if err := <-answer; err != nil {
		t.Fatal(err)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	rig.shutdown(t, idle, busy)
}

// BenchmarkHTTP measures small GETs (a 16-byte body) one after another on one
// kept-alive connection: over rsocket between two devices, and over Go's TCP on
// loopback, the baseline. One op is a request and its response.
func BenchmarkHTTP(b *testing.B) {
	body := testutil.Pattern(16, 1)
	handler := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.Write(body)
	})
	bench := func(b *testing.B, c *http.Client) {
		ctx := testutil.Context(b)
		url := "http://softrnic.test/small"
		b.ReportAllocs()
		for b.Loop() {
			got, err := fetch(ctx, c, url, nil)
			if err != nil {
				b.Fatal(err)
			}
			if len(got) != len(body) {
				b.Fatalf("%d bytes, want %d", len(got), len(body))
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
	}
	b.Run("rsocket", func(b *testing.B) {
		rig := newHTTPRig(b, handler)
		tr := rig.transport(nil)
		bench(b, &http.Client{Transport: tr})
		rig.shutdown(b, tr)
	})
	b.Run("tcp", func(b *testing.B) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		srv := &http.Server{Handler: handler}
		served := make(chan error, 1)
		go func() { served <- srv.Serve(l) }()
		addr := l.Addr().String()
		tr := &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "tcp", addr)
			},
		}
		bench(b, &http.Client{Transport: tr})
		if err := srv.Shutdown(testutil.Context(b)); err != nil {
			b.Fatal(err)
		}
		<-served
		tr.CloseIdleConnections()
	})
}

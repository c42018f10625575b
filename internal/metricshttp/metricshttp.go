// Package metricshttp serves a metrics registry for the command-line tools' --metrics
// flag: Prometheus's text format at /metrics and expvar's JSON at /debug/vars.
package metricshttp

import (
	"errors"
	"expvar"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/softrnic/softrnic/metrics"
)

// Server is a running metrics endpoint.
type Server struct {
	srv *http.Server
	ln  net.Listener
}

// Start listens on addr (host:port; port 0 picks a free one) and serves r at /metrics
// and expvar's variables (metrics.Default among them, as "softrnic") at /debug/vars,
// from a goroutine of its own. The listener is open when Start returns, so that a
// scraper may connect at once; a bad or busy address is Start's error.
func Start(addr string, r *metrics.Registry) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", r)
	mux.Handle("/debug/vars", expvar.Handler())
	s := &Server{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, ln: ln}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(os.Stderr, "metrics: %v\n", err)
		}
	}()
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Close stops the server.
func (s *Server) Close() error { return s.srv.Close() }

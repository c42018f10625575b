package main

import (
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/softrnic/softrnic/metrics"
)

// TestServeMetrics checks --metrics: rank r serves on the given port plus r, Prometheus
// text at /metrics and expvar at /debug/vars; a bad address is refused.
func TestServeMetrics(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	free := l.Addr().(*net.TCPAddr).Port
	l.Close()
	srv, err := serveMetrics("127.0.0.1:"+strconv.Itoa(free-2), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if got := srv.Addr().(*net.TCPAddr).Port; got != free {
		t.Fatalf("rank 2 serves on port %d, want %d", got, free)
	}
	for path, want := range map[string]string{"/metrics": metrics.ContentType, "/debug/vars": "application/json"} {
		resp, err := http.Get("http://" + srv.Addr().String() + path)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || !strings.HasPrefix(ct, want) {
			t.Errorf("%s: %s, %q", path, resp.Status, ct)
		}
	}
	for _, bad := range []string{"127.0.0.1", "127.0.0.1:x", "127.0.0.1:65535"} {
		if s, err := serveMetrics(bad, 1); err == nil {
			s.Close()
			t.Errorf("serveMetrics(%q) served", bad)
		}
	}
}

package perf

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/softrnic/softrnic/internal/metricshttp"
	"github.com/softrnic/softrnic/metrics"
)

// get fetches url and returns its body, failing the test unless the answer is 200 OK.
func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s, %v", url, resp.Status, err)
	}
	return string(b)
}

// sample returns the value of series in a Prometheus text scrape (-1: no such series).
func sample(text, series string) float64 {
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

// TestServerMetrics is rperf --metrics on a --cm server: the endpoint rperf starts
// (metricshttp, the registry in Config.Metrics) serves the server's device from the
// start, its counters and its connection manager's grow with a client's test, and
// expvar's variables are served beside them.
func TestServerMetrics(t *testing.T) {
	r := metrics.NewRegistry()
	ep, err := metricshttp.Start("127.0.0.1:0", r)
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	url := "http://" + ep.Addr().String()

	port := freeRoCEPort(t)
	srv, err := NewServer(Config{Test: "send_lat", Iters: 30, CM: true, RoCEPort: port, Metrics: r}, "127.0.0.1:0", DefaultAddrs[1])
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	dev := fmt.Sprintf(`{device="%v"}`, netip.AddrPortFrom(DefaultAddrs[1], uint16(port)))
	before := get(t, url+"/metrics")
	if v := sample(before, "softrnic_device_rx_packets_total"+dev); v < 0 {
		t.Fatalf("no counters of the server's device %s:\n%s", dev, before)
	}
	sc := make(chan error, 1)
	go func() {
		_, err := srv.ServeOne(false)
		sc <- err
	}()
	_, cerr := RunClient(Config{Test: "send_lat", Iters: 30, CM: true}, srv.Addr().String(), DefaultAddrs[0], false)
	if serr := <-sc; cerr != nil || serr != nil {
		t.Fatalf("client %v, server %v", cerr, serr)
	}
	after := get(t, url+"/metrics")
	for _, name := range []string{"softrnic_device_rx_packets_total", "softrnic_device_tx_packets_total", "softrnic_cm_established_total"} {
		if b, a := sample(before, name+dev), sample(after, name+dev); a <= b {
			t.Errorf("%s%s: %v before the test, %v after", name, dev, b, a)
		}
	}
	var vars map[string]json.RawMessage
	if err := json.Unmarshal([]byte(get(t, url+"/debug/vars")), &vars); err != nil || vars["memstats"] == nil || vars[metrics.ExpvarName] == nil {
		t.Errorf("/debug/vars: %v, variables %d", err, len(vars))
	}
}

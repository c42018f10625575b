package metrics_test

import (
	"bufio"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"

	"github.com/softrnic/softrnic/metrics"
	"github.com/softrnic/softrnic/verbs"
)

// A registry with one device, scraped over HTTP as Prometheus would (a program mounts
// metrics.Handler(), or its own registry, at /metrics).
func Example() {
	dev, err := verbs.OpenDevice(verbs.DeviceConfig{Addr: netip.MustParseAddr("127.0.0.1"), Port: verbs.AnyPort})
	if err != nil {
		log.Fatal(err)
	}
	defer dev.Close()
	r := metrics.NewRegistry()
	r.AddDevice(dev)
	srv := httptest.NewServer(r)
	defer srv.Close()

	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if line := sc.Text(); strings.Contains(line, "softrnic_device_qps") {
			fmt.Println(strings.ReplaceAll(line, dev.Addr().String(), "ADDR"))
		}
	}
	// Output:
	// # HELP softrnic_device_qps QPs the device has (created and not destroyed; QP1 not counted).
	// # TYPE softrnic_device_qps gauge
	// softrnic_device_qps{device="ADDR"} 0
}

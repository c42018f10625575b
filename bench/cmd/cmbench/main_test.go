package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// The test binary is also the listener process: serverCommand runs it again with this
// variable set, and TestMain then serves instead of testing.
const childEnv = "CMBENCH_TEST_LISTENER"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		o, err := parseFlags(os.Args[1:])
		if err == nil {
			err = serve(o, os.Stdin, os.Stdout)
		}
		if err != nil {
			fatal(err)
		}
		os.Exit(0)
	}
	serverCommand = func(args ...string) (*exec.Cmd, error) {
		cmd := exec.Command(os.Args[0], args...)
		cmd.Env = append(os.Environ(), childEnv+"=1")
		return cmd, nil
	}
	os.Exit(m.Run())
}

type logWriter struct{ t *testing.T }

func (w logWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// Two rounds through the listener process, as `cmbench -conns 100,200` runs them: every
// connection is established on both sides and disconnected, the QPs of the first round
// are destroyed before the second, and the table and the JSON say so.
func TestSmoke(t *testing.T) {
	o, err := parseFlags([]string{"-conns", "100,200", "-concurrency", "32", "-disconnect-concurrency", "16"})
	if err != nil {
		t.Fatal(err)
	}
	results, err := bench(o, logWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 2 {
		t.Fatalf("%d results, want 2", len(results))
	}
	for i, r := range results {
		want := []int{100, 200}[i]
		if !r.OK || r.Conns != want || r.Established != want || r.Failures != 0 || r.ServerEstablished != want ||
			r.ServerFailures != 0 || r.ServerEnded != want || r.ServerDestroyed != want || r.Disconnects != want || r.DisconnectFailures != 0 {
			t.Errorf("round %d: %+v", i, r)
		}
		if r.REQSent < uint64(want) || r.ConnsPerS <= 0 || r.DisconnectsPerS <= 0 ||
			r.DialP50US <= 0 || r.DialP50US > r.DialP99US || r.DialP99US > r.DialMaxUS {
			t.Errorf("round %d: implausible figures %+v", i, r)
		}
	}
	var table bytes.Buffer
	printResults(o, &table, results)
	if lines := strings.Split(strings.TrimSpace(table.String()), "\n"); len(lines) != 3 || !strings.Contains(lines[0], "conns/s") {
		t.Errorf("table:\n%s", table.String())
	}
	o.json = true
	var js bytes.Buffer
	printResults(o, &js, results)
	dec := json.NewDecoder(&js)
	for i := 0; i < 2; i++ {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"test", "conns", "concurrency", "seconds", "conns_per_s", "dial_p50_us", "dial_p99_us", "dial_max_us", "failures", "req_retries", "disconnects_per_s", "server_established"} {
			if _, ok := m[k]; !ok {
				t.Errorf("JSON object %d has no %q: %v", i, k, m)
			}
		}
		if m["test"] != "connect" {
			t.Errorf("test %v", m["test"])
		}
	}
}

// Nearest-rank percentiles of 1..100 ms.
func TestPercentile(t *testing.T) {
	if p := percentile(nil, 0.5); p != 0 {
		t.Errorf("empty: %v", p)
	}
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{0.5, 50 * time.Millisecond}, {0.99, 99 * time.Millisecond}, {1, 100 * time.Millisecond}, {0.001, time.Millisecond}} {
		if got := percentile(d, c.p); got != c.want {
			t.Errorf("p%v = %v, want %v", c.p*100, got, c.want)
		}
	}
}

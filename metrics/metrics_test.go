package metrics

import (
	"bufio"
	"encoding/json"
	"expvar"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/internal/verbstest"
	"github.com/softrnic/softrnic/msg"
	"github.com/softrnic/softrnic/verbs"
)

// exposition is a parsed scrape: each sample's value by its line's series text
// (name{labels}), and each family's type.
type exposition struct {
	samples map[string]float64
	types   map[string]string
}

var (
	metricName = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)
	labelPair  = regexp.MustCompile(`^([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\\\|\\"|\\n)*)"`)
)

// parse checks text against the exposition format's rules and returns its samples:
// every line a comment (HELP or TYPE) or "name{labels} value"; names and label names
// valid; one HELP and one TYPE per family, before its samples, and a family's samples
// together; no series twice.
func parse(t *testing.T, text string) exposition {
	t.Helper()
	x := exposition{samples: map[string]float64{}, types: map[string]string{}}
	helps := map[string]bool{}
	done := map[string]bool{} // families whose samples ended
	current := ""
	fail := func(n int, line, why string) {
		t.Helper()
		t.Fatalf("line %d %q: %s", n, line, why)
	}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			f := strings.SplitN(line, " ", 4)
			if len(f) < 4 || f[1] != "HELP" && f[1] != "TYPE" || !metricName.MatchString(f[2]) {
				fail(n, line, "not a HELP or TYPE line")
			}
			name := f[2]
			if name != current {
				if current != "" {
					done[current] = true
				}
				if done[name] {
					fail(n, line, "family seen before")
				}
			}
			switch f[1] {
			case "HELP":
				if helps[name] {
					fail(n, line, "second HELP")
				}
				helps[name] = true
			case "TYPE":
				if x.types[name] != "" {
					fail(n, line, "second TYPE")
				}
				switch f[3] {
				case "counter", "gauge", "summary", "histogram", "untyped":
				default:
					fail(n, line, "unknown type")
				}
				x.types[name] = f[3]
			}
			current = name
			continue
		}
		end := strings.IndexAny(line, "{ ")
		if end < 0 {
			fail(n, line, "no value")
		}
		name, rest := line[:end], line[end:]
		if !metricName.MatchString(name) {
			fail(n, line, "bad metric name")
		}
		family := name
		if x.types[current] == "summary" && (name == current+"_sum" || name == current+"_count") {
			family = current
		}
		if family != current || x.types[family] == "" || !helps[family] {
			fail(n, line, fmt.Sprintf("sample outside its family's HELP and TYPE (family %q)", current))
		}
		if strings.HasPrefix(rest, "{") {
			rest = rest[1:]
			for !strings.HasPrefix(rest, "}") {
				m := labelPair.FindStringSubmatch(rest)
				if m == nil {
					fail(n, line, "bad label")
				}
				rest = strings.TrimPrefix(rest[len(m[0]):], ",")
			}
			rest = rest[1:]
		}
		if !strings.HasPrefix(rest, " ") {
			fail(n, line, "no space before the value")
		}
		v, err := strconv.ParseFloat(rest[1:], 64)
		if err != nil {
			fail(n, line, "bad value")
		}
		if x.types[family] == "counter" && !strings.HasSuffix(name, "_total") {
			fail(n, line, "a counter's name does not end in _total")
		}
		series := line[:len(line)-len(rest)]
		if _, dup := x.samples[series]; dup {
			fail(n, line, "series twice")
		}
		x.samples[series] = v
	}
	for name := range x.types {
		if !helps[name] {
			t.Errorf("family %s has no HELP", name)
		}
	}
	return x
}

// value returns a sample's value, failing the test if there is none.
func (x exposition) value(t *testing.T, series string) float64 {
	t.Helper()
	v, ok := x.samples[series]
	if !ok {
		t.Fatalf("no sample %s", series)
	}
	return v
}

func scrape(t *testing.T, url string) exposition {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != ContentType {
		t.Fatalf("status %s, content type %q", resp.Status, resp.Header.Get("Content-Type"))
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return parse(t, string(b))
}

// TestScrapeWhileTrafficRuns scrapes a registry over HTTP while a goroutine keeps
// writing from one device's QP to the other's: the exposition parses, and the device and
// QP counters of both sides grow between two scrapes.
func TestScrapeWhileTrafficRuns(t *testing.T) {
	a, b := verbstest.NewPair(t, verbstest.PairConfig{})
	r := NewRegistry()
	r.AddDevice(a.Ctx)
	r.AddDevice(b.Ctx)
	srv := httptest.NewServer(r)
	defer srv.Close()

	src := verbstest.MustReg(t, a.PD, testutil.Pattern(4096, 1), verbs.AccessLocalWrite)
	dst := verbstest.MustReg(t, b.PD, make([]byte, 4096), verbstest.AllAccess)
	var completed atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // keeps one WRITE in flight until stop
		defer wg.Done()
		wc := make([]verbs.WorkCompletion, 1)
		for {
			select {
			case <-stop:
				return
			default:
			}
			wr := verbs.SendWR{WRID: 1, Opcode: verbs.WRRDMAWrite, SendFlags: verbs.SendSignaled,
				SGList: verbstest.SGL(src, 0, 4096), RemoteAddr: dst.Addr(), RKey: dst.RKey()}
			if err := a.QP.PostSend([]verbs.SendWR{wr}); err != nil {
				t.Error(err)
				return
			}
			if _, err := a.SCQ.Wait(testutil.Context(t), wc); err != nil || wc[0].Status != verbs.WCSuccess {
				t.Errorf("WRITE: %v, %v", err, wc[0].Status)
				return
			}
			completed.Add(1)
		}
	}()
	defer func() {
		close(stop)
		wg.Wait()
	}()

	devA := `device="` + a.Ctx.Addr().String() + `"`
	devB := `device="` + b.Ctx.Addr().String() + `"`
	qpA := fmt.Sprintf(`%s,qpn="%d"`, devA, a.QP.QPNum())
	qpB := fmt.Sprintf(`%s,qpn="%d"`, devB, b.QP.QPNum())
	grow := []string{
		"softrnic_device_tx_packets_total{" + devA + "}",
		"softrnic_device_tx_bytes_total{" + devA + "}",
		"softrnic_device_rx_packets_total{" + devB + "}",
		"softrnic_device_tx_packets_total{" + devB + "}", // ACKs
		"softrnic_qp_tx_packets_total{" + qpA + "}",
		"softrnic_qp_rx_packets_total{" + qpA + "}",
		"softrnic_qp_rx_bytes_total{" + qpB + "}",
		"softrnic_device_queue_rx_packets_total{" + devB + `,queue="0"}`,
	}
	verbstest.WaitUntil(t, "the first WRITEs", func() bool { return completed.Load() >= 10 })
	first := scrape(t, srv.URL)
	n := completed.Load()
	verbstest.WaitUntil(t, "more WRITEs", func() bool { return completed.Load() >= n+10 })
	second := scrape(t, srv.URL)
	for _, s := range grow {
		if v1, v2 := first.value(t, s), second.value(t, s); v2 <= v1 {
			t.Errorf("%s: %v, then %v: want it to grow", s, v1, v2)
		}
	}
	if v := second.value(t, "softrnic_device_qps{"+devA+"}"); v != 1 {
		t.Errorf("device A has %v QPs, want 1", v)
	}
	for _, name := range []string{"softrnic_qp_retransmits_total", "softrnic_handler_latency_seconds", "softrnic_cm_established_total", "softrnic_msg_eager_sent_total"} {
		if second.types[name] == "" {
			t.Errorf("no family %s", name)
		}
	}
	if second.types["softrnic_handler_latency_seconds"] != "summary" || second.types["softrnic_device_qps"] != "gauge" {
		t.Errorf("types: %v", second.types)
	}

	// The same counters as JSON, for expvar.
	var js struct {
		Devices []struct {
			Addr string
			QPs  []struct {
				QPN      uint32
				Counters verbs.Counters
			}
		}
	}
	if err := json.Unmarshal([]byte(r.String()), &js); err != nil {
		t.Fatalf("String is not JSON: %v", err)
	}
	if len(js.Devices) != 2 || js.Devices[0].Addr != a.Ctx.Addr().String() || len(js.Devices[0].QPs) != 1 ||
		js.Devices[0].QPs[0].QPN != a.QP.QPNum() || js.Devices[0].QPs[0].Counters.TxPackets == 0 {
		t.Errorf("JSON: %+v", js)
	}
}

// TestClosedDeviceLeaves checks that a closed device is no longer published, and that
// a removed one is not either.
func TestClosedDeviceLeaves(t *testing.T) {
	a, b := verbstest.NewPair(t, verbstest.PairConfig{})
	r := NewRegistry()
	r.AddDevice(a.Ctx)
	r.AddDevice(b.Ctx)
	r.RemoveDevice(b.Ctx)
	if err := a.Ctx.Close(); err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	x := parse(t, w.Body.String())
	if len(x.samples) != 0 {
		t.Errorf("samples of a closed and a removed device: %v", x.samples)
	}
	r.mu.Lock()
	n := len(r.devices)
	r.mu.Unlock()
	if n != 0 {
		t.Errorf("the registry keeps %d devices", n)
	}
}

// TestCommCounters publishes a 2-rank job's communicators: their counters, labelled by
// device and rank, count the message sent, and their devices come with them.
func TestCommCounters(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	root := l.Addr().String()
	l.Close()
	comms := make([]*msg.Comm, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for rank := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			comms[rank], errs[rank] = msg.Init(testutil.Context(t), msg.Config{Rank: rank, Size: 2, Root: root,
				Device: verbs.DeviceConfig{Faults: &verbs.Faults{}}})
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	r := NewRegistry()
	for _, c := range comms {
		defer c.Close()
		r.AddComm(c)
	}
	ctx := testutil.Context(t)
	done := make(chan error, 1)
	go func() {
		_, err := comms[1].Recv(ctx, make([]byte, 8), 0, 7)
		done <- err
	}()
	if err := comms[0].Send(ctx, []byte("12345678"), 1, 7); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	x := parse(t, w.Body.String())
	rank := func(c *msg.Comm) string {
		return fmt.Sprintf(`device="%s",rank="%d"`, c.Device().Addr(), c.Rank())
	}
	if v := x.value(t, "softrnic_msg_eager_sent_total{"+rank(comms[0])+"}"); v != 1 {
		t.Errorf("rank 0 sent %v eager messages, want 1", v)
	}
	if v := x.value(t, "softrnic_msg_eager_received_total{"+rank(comms[1])+"}"); v != 1 {
		t.Errorf("rank 1 received %v eager messages, want 1", v)
	}
	if v := x.value(t, "softrnic_msg_ranks{"+rank(comms[1])+"}"); v != 2 {
		t.Errorf("ranks %v, want 2", v)
	}
	dev := `device="` + comms[0].Device().Addr().String() + `"`
	if v := x.value(t, "softrnic_cm_established_total{"+dev+"}"); v < 1 {
		t.Errorf("rank 0's device: %v connections established, want 1 or more", v)
	}
}

// checkTable checks that table publishes every uint64 field of T but those in skip, each
// read from the field it names.
func checkTable[T any](t *testing.T, table []counter[T], skip ...string) {
	t.Helper()
	var v T
	rv := reflect.ValueOf(&v).Elem()
	want := map[string]uint64{}
	for i := 0; i < rv.NumField(); i++ {
		f := rv.Type().Field(i)
		if f.Type.Kind() != reflect.Uint64 {
			continue
		}
		rv.Field(i).SetUint(uint64(i + 1))
		want[f.Name] = uint64(i + 1)
	}
	names := map[string]bool{}
	for _, c := range table {
		if got := c.get(&v); got != want[c.field] || want[c.field] == 0 {
			t.Errorf("%T: %s reads %d, want field %s's %d", v, c.name, got, c.field, want[c.field])
		}
		if names[c.name] || !metricName.MatchString(c.name) {
			t.Errorf("%T: name %q twice or invalid", v, c.name)
		}
		names[c.name] = true
		delete(want, c.field)
	}
	for _, s := range skip {
		delete(want, s)
	}
	for f := range want {
		t.Errorf("%T.%s is not published", v, f)
	}
}

// TestEveryCounterPublished checks that every counter field of verbs, cm and msg has its
// metric (a counter added later fails here until it is published).
func TestEveryCounterPublished(t *testing.T) {
	checkTable(t, append(append([]counter[verbs.Counters](nil), packetCounters...), deviceCounters...))
	checkTable(t, queueCounters)
	checkTable(t, handlerCounters)
	checkTable(t, srqCounters)
	checkTable(t, cmCounters)
	checkTable(t, sidrCounters)
	checkTable(t, msgCounters)
	seen := map[string]bool{}
	for _, f := range families {
		if seen[f.name] || !metricName.MatchString(f.name) {
			t.Errorf("family %q twice or invalid", f.name)
		}
		seen[f.name] = true
	}
}

// TestLabelEscaping checks label values and help text escaped as the format wants.
func TestLabelEscaping(t *testing.T) {
	if got, want := escapeLabel("a\"b\\c\nd"), `a\"b\\c\nd`; got != want {
		t.Errorf("label: %s, want %s", got, want)
	}
	if got, want := string(appendEscaped(nil, "a\"b\\c\nd", false)), `a"b\\c\nd`; got != want {
		t.Errorf("help: %s, want %s", got, want)
	}
	if got, want := labelName("hard RNR"), "hard_rnr"; got != want {
		t.Errorf("labelName: %s, want %s", got, want)
	}
}

// TestDefaultPublished checks that Default is published through expvar and served by
// Handler.
func TestDefaultPublished(t *testing.T) {
	if Handler() != http.Handler(Default) {
		t.Error("Handler is not Default")
	}
	if v := expvar.Get(ExpvarName); v != Default {
		t.Errorf("expvar %q is %v, want Default", ExpvarName, v)
	}
}

// BenchmarkScrape1000QPs times a scrape of a device with 1,000 QPs (and a connection
// manager), written to a discarding ResponseWriter.
func BenchmarkScrape1000QPs(b *testing.B) {
	dev := verbstest.OpenDevice(b, verbstest.IPA, verbs.DeviceConfig{})
	s := verbstest.NewSide(b, dev, verbstest.SideConfig{Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1}, CQE: 16})
	for i := 1; i < 1000; i++ {
		if _, err := s.PD.CreateQP(&verbs.QPInitAttr{SendCQ: s.SCQ, RecvCQ: s.RCQ, Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1}}); err != nil {
			b.Fatal(err)
		}
	}
	l, err := cm.Listen(dev, 7000)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	r := NewRegistry()
	r.AddDevice(dev)
	req := httptest.NewRequest("GET", "/metrics", nil)
	w := &discard{h: http.Header{}}
	r.ServeHTTP(w, req)
	b.SetBytes(int64(w.n))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		r.ServeHTTP(w, req)
	}
	b.ReportMetric(float64(w.n)/float64(b.N+1), "B/scrape")
}

type discard struct {
	h http.Header
	n int
}

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) WriteHeader(int)             {}
func (d *discard) Write(p []byte) (int, error) { d.n += len(p); return len(p), nil }

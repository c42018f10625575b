package perf

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/verbs"
)

// The exchange's messages against what perftest 4.5-0.17 (the "6.06" of Debian 12) sent in
// the transcripts under testdata/perftest-4.5-0.17 (see ptTranscript).

func TestPerftestDest(t *testing.T) {
	// ib_write_bw's client in testdata/perftest-4.5-0.17/write_bw.txt.
	wire := "0000:0001:000012:5437a6:000003cd:00005600682ae000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:4d:00:04:00000000:\x00"
	want := ptDest{OutReads: 1, QPN: 0x12, PSN: 0x5437a6, RKey: 0x3cd, VAddr: 0x5600682ae000,
		GID: verbs.GIDFromAddr(netip.MustParseAddr("10.77.0.4"))}
	if len(wire) != ptDestLen {
		t.Fatalf("test string is %d bytes", len(wire))
	}
	if got := want.marshal(); string(got) != wire {
		t.Fatalf("marshal:\n%q\nwant\n%q", got, wire)
	}
	got, err := parsePtDest([]byte(wire))
	if err != nil || got != want {
		t.Fatalf("parse: %+v, %v", got, err)
	}
	// rxe's read and atomic tests give 128 outstanding reads; every field at its widest.
	full := ptDest{LID: 0xFFFF, OutReads: 0x80, QPN: 0xFFFFFF, PSN: 0xFFFFFF, RKey: 0xFFFFFFFF, VAddr: math.MaxUint64, SRQN: 0xFFFFFFFF,
		GID: verbs.GIDFromAddr(netip.MustParseAddr("fe80::5054:ff:fe77:4"))}
	b := full.marshal()
	if len(b) != ptDestLen || b[ptDestLen-1] != 0 || bytes.IndexByte(b, 0) != ptDestLen-1 {
		t.Fatalf("widest fields: %q", b)
	}
	if got, err := parsePtDest(b); err != nil || got != full {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	// perftest reads fields with strtol: a wider field than the format's is still a number.
	if got, err := parsePtDest([]byte(strings.Replace(wire, "000012", "00000012", 1))); err != nil || got.QPN != 0x12 {
		t.Fatalf("wide field: %+v, %v", got, err)
	}
	for _, bad := range []string{"", "0000:0001", strings.Replace(wire, "5437a6", "54x7a6", 1), strings.Replace(wire, ":ff:ff:", ":ff:", 1)} {
		if _, err := parsePtDest([]byte(bad)); err == nil {
			t.Errorf("parsed %q", bad)
		}
	}
}

func TestPerftestPrefixMessages(t *testing.T) {
	if got := versionMessage(ptVersion); string(got) != "6.06\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00" {
		t.Fatalf("version %q", got)
	}
	if got := mtuMessage(verbs.MTU1024, 2); string(got) != "3\x00" {
		t.Fatalf("mtu %q", got)
	}
	if got := mtuMessage(verbs.MTU4096, 4); string(got) != "5\x00\x00\x00" {
		t.Fatalf("mtu %q", got)
	}
	for s, want := range map[string]verbs.MTU{"3\x00": verbs.MTU1024, "1\x00": verbs.MTU256, "5\x00": verbs.MTU4096, "0\x00": 0, "6\x00": 0, "x\x00": 0} {
		if got := parseMTUMessage([]byte(s)); got != want {
			t.Errorf("parseMTUMessage(%q) = %v, want %v", s, got, want)
		}
	}
	for s, want := range map[string]float64{"6.06\x00junk": 6.06, "5.70": 5.70, "5.7.1": 5.7, " 6": 6, "": 0, `{"config"`: 0, "v6": 0} {
		if got := atof([]byte(s)); got != want {
			t.Errorf("atof(%q) = %v, want %v", s, got, want)
		}
	}
}

// TestPerftestReport decodes the report ib_write_bw's client sent its server in the
// write_bw transcript and formats it as rperf's perftest mode prints results: the line
// must be the one perftest printed (and the latency line likewise).
func TestPerftestReport(t *testing.T) {
	msgs := ptTranscript(t, "write_bw")
	var reps [][]byte // the client's 8-byte messages: size, iterations, peak, average, rate
	for _, m := range msgs {
		if m.client && len(m.b) == 8 {
			reps = append(reps, m.b)
		}
	}
	if len(reps) != 5 {
		t.Fatalf("%d report messages", len(reps))
	}
	u := func(i int) uint64 { return binary.BigEndian.Uint64(reps[i]) }
	f := func(i int) float64 { return math.Float64frombits(u(i)) }
	r := Result{Size: int(u(0)), Iters: int(u(1)), BWPeak: f(2), BW: f(3), MsgRate: f(4)}
	const printed = " 4096       20               33.74              6.24   \t\t   0.001598" // ib_write_bw's line
	if got := r.PerftestRow(); got != printed {
		t.Fatalf("row\n%q\nwant\n%q", got, printed)
	}
	// Encoding ours gives the same bytes back.
	var out bytes.Buffer
	pc := &ptConn{conn: writerConn{w: &out}, r: bytes.NewReader(make([]byte, 40)), client: true, remVersion: 6.06}
	if _, err := pc.reports(ptReport{Size: uint64(r.Size), Iters: uint64(r.Iters), Peak: r.BWPeak, Avg: r.BW, MsgRate: r.MsgRate}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), bytes.Join(reps, nil)) {
		t.Fatalf("report %x, want %x", out.Bytes(), bytes.Join(reps, nil))
	}
	// Peers before 5.33 send the iterations in 4 bytes.
	out.Reset()
	pc = &ptConn{conn: writerConn{w: &out}, r: bytes.NewReader(make([]byte, 36)), client: true, remVersion: 5.32}
	if _, err := pc.reports(ptReport{Iters: 20}); err != nil || out.Len() != 36 || !bytes.Equal(out.Bytes()[8:12], []byte{0, 0, 0, 20}) {
		t.Fatalf("old peer: %x, %v", out.Bytes(), err)
	}
	lat := Result{Size: 2, Iters: 20, Lat: &Latency{Min: 3041.31, Max: 9037.34, P50: 4263.70, Avg: 4863.79, Stdev: 1177.34, P99: 9037.34, P999: 9037.34}}
	const latPrinted = " 2       20          3041.31        9037.34      4263.70  \t       4863.79     \t1177.34\t\t9037.34 \t\t9037.34" // ib_write_lat's
	if got := lat.PerftestRow(); got != latPrinted {
		t.Fatalf("latency row\n%q\nwant\n%q", got, latPrinted)
	}
	lat = Result{Size: 2, Iters: 20, Lat: &Latency{Min: 27.71, Max: 128.34, P50: 28.66, Avg: 44.48, Stdev: 27.82, P99: 128.34, P999: 128.34}}
	const latPrinted2 = " 2       20          27.71          128.34       28.66    \t       44.48       \t27.82  \t\t128.34  \t\t128.34 " // ib_read_lat's
	if got := lat.PerftestRow(); got != latPrinted2 {
		t.Fatalf("latency row\n%q\nwant\n%q", got, latPrinted2)
	}
}

// writerConn is a net.Conn that only writes, into a buffer.
type writerConn struct {
	net.Conn
	w io.Writer
}

func (c writerConn) Write(b []byte) (int, error) { return c.w.Write(b) }

// TestPerftestFigures checks the result computations against perftest's formulas on
// timings worked out by hand.
func TestPerftestFigures(t *testing.T) {
	// Ten posts 1 µs apart, then intervals 1, 2 .. 9 µs: sorted, the two largest (8 and 9)
	// dropped, the seven left are 1..7 µs, halved for a ping-pong.
	tp := []int64{0}
	for i := 1; i <= 9; i++ {
		tp = append(tp, tp[i-1]+int64(i)*1000)
	}
	r := ptLatResult(2, tp, 2)
	l := r.Lat
	// measure_cnt 7 (odd): the median is the middle one, 4/2; the mean 2; t_max is
	// delta[7] = 8/2; 99 %: delta[ceil(6.93)] = delta[7]; the deviations 1.5, 1, 0.5, 0,
	// -0.5, -1, -1.5 truncate to 1, 1, 0, 0, 0, -1, -1: stdev sqrt(4/7).
	want := Latency{Min: 0.5, Max: 4, P50: 2, Avg: 2, Stdev: math.Sqrt(4.0 / 7), P99: 4, P999: 4}
	if *l != want || r.Iters != 10 {
		t.Fatalf("latency %+v, want %+v", *l, want)
	}
	// An even count: the median is the mean of the middle two (READ: not halved).
	r = ptLatResult(8, tp[:9], 1)
	if r.Lat.P50 != 3.5 || r.Lat.Min != 1 || r.Lat.Max != 7 { // measure_cnt 6: t_max is delta[6]
		t.Fatalf("latency %+v", *r.Lat)
	}

	// Bandwidth: 4 messages of 1 MiB posted at 0, completions signaled every 2nd (cq_mod
	// 2) at 2 ms and 4 ms: 4 MiB in 4 ms; the peak is the best of (tc[j]-tp[i])/(j-i+1).
	const ms = int64(1e6)
	tposted := []int64{0, 0, 0, ms}
	tcompleted := []int64{0, 2 * ms, 0, 4 * ms}
	r = ptBWResult(1<<20, 4, tposted, tcompleted, 2, false)
	// Candidates: i=0: j=1 2ms/2, j=3 4ms/4; i=1: j=1 2ms/1, j=3 4ms/3; i=2: j=3 4ms/2;
	// i=3: j=3 3ms/1: the best is 1 ms per message: 1000 MiB/s.
	if math.Abs(r.BW-1000) > 1e-9 || math.Abs(r.BWPeak-1000) > 1e-9 || math.Abs(r.MsgRate-0.001) > 1e-12 || r.Iters != 4 {
		t.Fatalf("bandwidth %+v", r)
	}
	tposted[1], tposted[2] = ms/2, ms
	r = ptBWResult(1<<20, 4, tposted, tcompleted, 2, false) // i=1, j=1: 1.5 ms for one
	if math.Abs(r.BWPeak-1000) > 1e-9 {
		t.Fatalf("peak %v", r.BWPeak)
	}
	tcompleted[1] = ms + ms/4 // i=0, j=1: 1.25 ms for two
	if r = ptBWResult(1<<20, 4, tposted, tcompleted, 2, false); math.Abs(r.BWPeak-1000/0.625) > 1e-9 {
		t.Fatalf("peak %v", r.BWPeak)
	}
	if r = ptBWResult(1<<20, 4, tposted[:1], tcompleted[3:], 2, true); r.BWPeak != 0 || math.Abs(r.BW-1000) > 1e-9 {
		t.Fatalf("no peak: %+v", r)
	}
}

// ptMsg is one message of a transcript.
type ptMsg struct {
	client bool // from the client
	b      []byte
}

// ptTranscript reads testdata/perftest-4.5-0.17/NAME.txt: the TCP payloads between
// perftest's server and client of that test, as tcpdump captured them (one segment per
// message: perftest writes each with one write(2), and each went alone).
func ptTranscript(t *testing.T, name string) []ptMsg {
	return readTranscript(t, filepath.Join("testdata", "perftest-4.5-0.17", name+".txt"))
}

// readTranscript reads a transcript file: "C hex" and "S hex" lines, '#' comments.
func readTranscript(t *testing.T, path string) []ptMsg {
	name := filepath.Base(path)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var msgs []ptMsg
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		dir, h, _ := strings.Cut(line, " ")
		b, err := hex.DecodeString(h)
		if err != nil || dir != "C" && dir != "S" {
			t.Fatalf("%s: bad line %q", name, line)
		}
		msgs = append(msgs, ptMsg{client: dir == "C", b: b})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return msgs
}

// ptFakeReport is what the exchange tests' traffic stub reports.
var ptFakeReport = Result{Size: 4096, Iters: 20, BW: 6.25, BWPeak: 33.5, MsgRate: 0.0016}

// replayPeer plays one side of a transcript on conn: it writes that side's messages and
// reads the other side's, which come from the session under test, and checks each
// against what perftest sent in its place (exactly, except for the handshake's values
// and the report's figures, which are checked for their form).
func replayPeer(msgs []ptMsg, conn net.Conn, asClient bool, ours verbs.GID) error {
	defer conn.Close()
	reports := 0
	for i, m := range msgs {
		if m.client == asClient {
			if _, err := conn.Write(m.b); err != nil {
				return fmt.Errorf("message %d: %w", i, err)
			}
			continue
		}
		got := make([]byte, len(m.b))
		if _, err := io.ReadFull(conn, got); err != nil {
			return fmt.Errorf("message %d (%d bytes, %q): %w", i, len(m.b), m.b, err)
		}
		switch len(m.b) {
		case ptDestLen:
			d, err := parsePtDest(got)
			if err != nil {
				return fmt.Errorf("message %d: %w", i, err)
			}
			want, _ := parsePtDest(m.b)
			for k := range got { // the same shape: every ':' and the NUL where perftest's are
				if (got[k] == ':' || got[k] == 0 || m.b[k] == ':' || m.b[k] == 0) && got[k] != m.b[k] {
					return fmt.Errorf("message %d: %q, perftest sent %q", i, got, m.b)
				}
			}
			if d.GID != ours || d.OutReads != want.OutReads || d.LID != 0 || d.SRQN != 0 || d.QPN == 0 || d.RKey == 0 && want.RKey != 0 {
				return fmt.Errorf("message %d: %+v (perftest's: %+v)", i, d, want)
			}
		case 8: // a report: the client's are the stub's figures, the server sends zeros
			var want uint64
			if !asClient {
				r := ptFakeReport
				want = []uint64{uint64(r.Size), uint64(r.Iters), math.Float64bits(r.BWPeak), math.Float64bits(r.BW), math.Float64bits(r.MsgRate)}[reports]
			}
			if v := binary.BigEndian.Uint64(got); v != want {
				return fmt.Errorf("report message %d: %#x, want %#x", reports, v, want)
			}
			reports++
		default: // version, page and cache line size, MTU, "done": as perftest's
			if !bytes.Equal(got, m.b) {
				return fmt.Errorf("message %d: %q, perftest sent %q", i, got, m.b)
			}
		}
	}
	// Nothing more may come: the session closes the connection.
	if n, err := conn.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
		return fmt.Errorf("after the transcript: %d bytes, %v", n, err)
	}
	return nil
}

// tcpPair returns the two ends of a TCP connection on 127.0.0.1.
func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	return a, b
}

// TestPerftestTranscripts runs each test's exchange in both roles against perftest's own
// side of a recorded exchange, with the traffic left out: every message must come in
// perftest's order, size and form, and the session must take perftest's messages as they
// were.
func TestPerftestTranscripts(t *testing.T) {
	for _, test := range Tests {
		msgs := ptTranscript(t, test)
		for _, client := range []bool{true, false} {
			role := map[bool]string{true: "client", false: "server"}[client]
			t.Run(test+"/"+role, func(t *testing.T) {
				c := Config{Test: test, Perftest: true, Iters: 20, MTU: 1024, RoCEPort: 4791}
				if test == "write_bw" {
					c.Size = 4096
				}
				c.Defaults()
				if err := c.Validate(); err != nil {
					t.Fatal(err)
				}
				dev, err := verbs.OpenDevice(verbs.DeviceConfig{Addr: DefaultAddrs[0], Port: verbs.AnyPort})
				if err != nil {
					t.Fatal(err)
				}
				defer dev.Close()
				mine, theirs := tcpPair(t)
				peer := make(chan error, 1)
				go func() { peer <- replayPeer(msgs, theirs, !client, verbs.GIDFromAddr(DefaultAddrs[0])) }()
				sess := &ptSession{cfg: &c, pc: &ptConn{conn: mine, r: mine, client: client}, ownMTU: verbs.MTU1024,
					open:    func(p ptParams) (*ptSide, error) { return newPtSide(&c, client, dev, netip.Addr{}, p) },
					traffic: func(int) (Result, error) { return ptFakeReport, nil }}
				rs, err := sess.run()
				mine.Close()
				if perr := <-peer; err != nil || perr != nil {
					t.Fatalf("session: %v; perftest's side: %v", err, perr)
				}
				if sess.pc.remVersion != 6.06 || sess.s.params != (ptParams{Cycle: 4096, CacheLine: 64, MTU: verbs.MTU1024}) {
					t.Fatalf("settled on %+v with version %v", sess.s.params, sess.pc.remVersion)
				}
				// What this side reports: the client its own; the server of the one-sided
				// bandwidth tests the client's report (perftest's figures in the
				// transcript), of send_bw and the ping-pongs its own, of read_lat and
				// atomic_lat nothing (a passive result).
				if len(rs) != 1 || rs[0].Passive != (!client && (test == "read_lat" || test == "atomic_lat")) {
					t.Fatalf("%d results: %+v", len(rs), rs)
				}
				if !client && rs[0].Measured == "client" && (rs[0].Iters != 20 || rs[0].BW <= 0) {
					t.Fatalf("the client's report: %+v", rs[0])
				}
			})
		}
	}
}

// ptRaceSkips: in the race run, write_lat is left out (it polls memory the peer's RDMA
// WRITE lands in, as perftest does) and --check off where the server reads what the
// peer's operations left once the control connection says they are done (the ordering
// comes through the network, which the race detector cannot see).
func ptRaceSkips(test string) (skip, noCheck bool) {
	if !testutil.Race {
		return false, false
	}
	return test == "write_lat", test == "write_bw" || isAtomic(test)
}

// TestPerftestLoopback runs every test in perftest mode between two rperfs (client and
// server roles in one run; devices 127.0.0.1 and 127.0.0.2 on one UDP port), with
// --check (both sides rperf: known buffer contents, verified where they land), and
// looks at what each side reports.
func TestPerftestLoopback(t *testing.T) {
	for _, test := range Tests {
		skip, noCheck := ptRaceSkips(test)
		if skip {
			continue
		}
		cfgs := []Config{
			{Test: test, Iters: 40},
			{Test: test, Iters: 37, Size: 5000, MTU: 1024}, // several packets a message, a size of no power of two
			{Test: test, Iters: 50, Size: 100},             // messages move along the buffer in cache-line steps
		}
		if isBW(test) {
			cfgs = append(cfgs,
				Config{Test: test, Iters: 101, QPs: 3, TxDepth: 16, Size: 3000},       // several QPs, the window, CQ moderation 16
				Config{Test: test, Iters: 12, Size: 256 << 10, CQMod: 5, TxDepth: 10}) // messages bigger than the cycle buffer
		}
		if strings.HasPrefix(test, "send_") {
			cfgs = append(cfgs, Config{Test: test, Iters: 120, RxDepth: 20}) // receives re-posted
		}
		for _, c := range cfgs {
			c.Perftest, c.Check = true, !noCheck
			name := fmt.Sprintf("%s size %d qps %d", test, c.Size, c.QPs)
			cr, sr, err := PerftestLoopback(c, DefaultAddrs, true)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			c.Defaults()
			iters := c.Iters * c.QPs
			if len(cr) != 1 {
				t.Fatalf("%s: client results %+v", name, cr)
			}
			r := cr[0]
			if !r.Perftest || r.Measured != "client" || r.Iters != iters || r.Size != c.Size || r.Checked != c.Check ||
				r.PeerVersion != ptVersion || r.Counters == nil || r.Counters.Client.TxPackets == 0 || r.BW <= 0 || r.MsgRate <= 0 {
				t.Fatalf("%s: client %+v", name, r)
			}
			if wantMTU := max(c.MTU, 4096); c.MTU == 0 && r.MTU != wantMTU || c.MTU != 0 && r.MTU != c.MTU { // loopback: 4096
				t.Fatalf("%s: MTU %d", name, r.MTU)
			}
			if isBW(test) != (r.Lat == nil) || r.Lat != nil && !(r.Lat.Min <= r.Lat.P50 && r.Lat.P50 <= r.Lat.P99 && r.Lat.P99 <= r.Lat.Max) {
				t.Fatalf("%s: latency %+v", name, r.Lat)
			}
			switch test {
			case "write_bw", "read_bw", "atomic_bw":
				// The server reports the client's report, as perftest's server prints it.
				if len(sr) != 1 || sr[0].Measured != "client" || sr[0].BW != r.BW || sr[0].BWPeak != r.BWPeak || sr[0].MsgRate != r.MsgRate || sr[0].Iters != iters {
					t.Fatalf("%s: server %+v, client %+v", name, sr, r)
				}
			case "read_lat", "atomic_lat":
				if len(sr) != 1 || !sr[0].Passive || sr[0].Measured != "" || sr[0].Lat != nil || sr[0].Counters.Server.TxPackets == 0 {
					t.Fatalf("%s: server %+v", name, sr)
				}
			default: // send_bw and the ping-pongs: the server measures too
				if len(sr) != 1 || sr[0].Measured != "server" || sr[0].Iters != iters || sr[0].BW <= 0 || sr[0].Counters.Server.RxPackets == 0 {
					t.Fatalf("%s: server %+v", name, sr)
				}
			}
			if test == "send_bw" && (r.BWPeak <= 0 || sr[0].BWPeak != 0) {
				t.Fatalf("%s: peaks %v (client), %v (server: perftest computes none)", name, r.BWPeak, sr[0].BWPeak)
			}
		}
	}
}

// TestPerftestAllSizes runs -a (every size in one connection; here up to 64 KiB, not
// 8 MiB) where the exchange differs: send_bw synchronises before and after each size,
// write_lat's sides go through the sizes on the data alone, read_bw's server only waits.
func TestPerftestAllSizes(t *testing.T) {
	for _, test := range []string{"send_bw", "write_lat", "read_bw"} {
		if skip, _ := ptRaceSkips(test); skip {
			continue
		}
		c := Config{Test: test, Iters: 5, AllSizes: true, Perftest: true, Check: true, allUpTo: 64 << 10}
		cr, sr, err := PerftestLoopback(c, DefaultAddrs, false)
		if err != nil {
			t.Fatalf("%s -a: %v", test, err)
		}
		if len(cr) != 16 || cr[0].Size != 2 || cr[15].Size != 64<<10 {
			t.Fatalf("%s -a: %d client results", test, len(cr))
		}
		wantServer := 16
		if test == "read_bw" {
			wantServer = 1 // the client's last report
		}
		if len(sr) != wantServer || sr[len(sr)-1].Size != 64<<10 {
			t.Fatalf("%s -a: %d server results", test, len(sr))
		}
	}
}

// freeRoCEPort returns a UDP port free on both loopback device addresses.
func freeRoCEPort(t *testing.T) int {
	for range 20 {
		a, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.ParseIP(DefaultAddrs[0].String())})
		if err != nil {
			t.Fatal(err)
		}
		port := a.LocalAddr().(*net.UDPAddr).Port
		b, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.ParseIP(DefaultAddrs[1].String()), Port: port})
		a.Close()
		if err == nil {
			b.Close()
			return port
		}
	}
	t.Fatal("no UDP port free on both addresses")
	return 0
}

// serveAndRun runs Serve with own in a goroutine and client against it.
func serveAndRun(t *testing.T, own Config, srvDev netip.Addr, client func(ctl string) error) ([]Result, error, error) {
	addrc := make(chan net.Addr, 1)
	type out struct {
		rs  []Result
		err error
	}
	sc := make(chan out, 1)
	go func() {
		rs, err := Serve(own, "127.0.0.1:0", srvDev, false, func(a net.Addr) { addrc <- a })
		sc <- out{rs, err}
	}()
	ctl := (<-addrc).String()
	cerr := client(ctl)
	if cerr != nil {
		// The client may have failed before it connected: end the server's Accept.
		if c, err := net.Dial("tcp", ctl); err == nil {
			c.Close()
		}
	}
	o := <-sc
	return o.rs, o.err, cerr
}

// TestPerftestServe goes through Serve and PerftestClient, what rperf's server and client
// run: the server tells a perftest-mode client from an rperf one by its first byte,
// settles on the smaller MTU, and either side explains a peer of the other protocol.
func TestPerftestServe(t *testing.T) {
	port := freeRoCEPort(t)
	var cr []Result
	srs, serr, cerr := serveAndRun(t, Config{Test: "send_lat", Iters: 50, MTU: 2048, RoCEPort: port, Check: true}, DefaultAddrs[1], func(ctl string) error {
		var err error
		cr, err = PerftestClient(Config{Test: "send_lat", Iters: 50, RoCEPort: port, Check: true}, ctl, DefaultAddrs[0], false)
		return err
	})
	if serr != nil || cerr != nil {
		t.Fatalf("server %v, client %v", serr, cerr)
	}
	if len(cr) != 1 || len(srs) != 1 || cr[0].MTU != 2048 || srs[0].MTU != 2048 || srs[0].Measured != "server" {
		t.Fatalf("client %+v, server %+v", cr, srs)
	}
	// An rperf client in rperf's own mode is still served as before (TestClientServer),
	// but not by a server that takes perftest's exchange only; nor does a perftest-mode
	// server serve it.
	_, serr, cerr = serveAndRun(t, Config{Test: "write_bw", Perftest: true, RoCEPort: port}, DefaultAddrs[1], func(ctl string) error {
		_, err := RunClient(Config{Test: "write_bw", Iters: 10}, ctl, DefaultAddrs[0], false)
		return err
	})
	if serr == nil || !strings.Contains(serr.Error(), "--perftest") || cerr == nil || !strings.Contains(cerr.Error(), "--perftest") {
		t.Fatalf("rperf client, perftest-mode server: server %v, client %v", serr, cerr)
	}
	// Two devices on one address (on two ports here: two rperfs on one host given no
	// --dev-addr would share 4791): the exchange carries no port to tell them apart.
	port2 := freeRoCEPort(t)
	_, serr, cerr = serveAndRun(t, Config{Test: "read_lat", Iters: 10, RoCEPort: port}, DefaultAddrs[0], func(ctl string) error {
		_, err := PerftestClient(Config{Test: "read_lat", Iters: 10, RoCEPort: port2}, ctl, DefaultAddrs[0], false)
		return err
	})
	if cerr == nil || !strings.Contains(cerr.Error(), "--dev-addr") || serr == nil {
		t.Fatalf("one address: server %v, client %v", serr, cerr)
	}
}

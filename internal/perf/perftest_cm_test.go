package perf

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/verbs"
)

// TestPerftestDestBinary: over rdma_cm the handshake is perftest's struct pingpong_dest,
// its integers big-endian, as rdma_write_keys sends it.
func TestPerftestDestBinary(t *testing.T) {
	d := ptDest{LID: 0x1234, OutReads: 0x80, QPN: 0x11, PSN: 0xabcdef, RKey: 0x1a2b3c4d, VAddr: 0x5600682ae000,
		GID: verbs.GIDFromAddr(netip.MustParseAddr("10.77.0.4")), SRQN: 7}
	want, _ := hex.DecodeString("00001234" + "00000080" + "00000011" + "00abcdef" + "1a2b3c4d" + "00000000" +
		"00005600682ae000" + "00000000000000000000ffff0a4d0004" + "00000007" + "00000000")
	b := d.marshalBinary()
	if !bytes.Equal(b, want) {
		t.Fatalf("marshal:\n%x\nwant\n%x", b, want)
	}
	got, err := parsePtDestBinary(b)
	if err != nil || got != d {
		t.Fatalf("parse: %+v, %v", got, err)
	}
	// perftest's sync handshakes around its rdma_cm connections carry zeros.
	if z := (ptDest{}).marshalBinary(); !bytes.Equal(z, make([]byte, ptDestBinLen)) {
		t.Fatalf("zeros: %x", z)
	}
	for _, n := range []int{0, 55, 57, 108} {
		if _, err := parsePtDestBinary(make([]byte, n)); err == nil {
			t.Errorf("parsed %d bytes", n)
		}
	}
}

// TestPerftestCMLoopback runs every test in perftest mode with -R between two rperfs:
// the exchange over an RC QP that rdma_cm connected, the test's QPs connected through
// rdma_cm, --check, and what each side reports.
func TestPerftestCMLoopback(t *testing.T) {
	for _, test := range Tests {
		skip, noCheck := ptRaceSkips(test)
		if skip {
			continue
		}
		cfgs := []Config{{Test: test, Iters: 40}}
		if isBW(test) {
			cfgs = append(cfgs, Config{Test: test, Iters: 31, QPs: 3, TxDepth: 8, Size: 3000}) // several QPs, each its own connection
		} else {
			cfgs = append(cfgs, Config{Test: test, Iters: 25, Size: 5000, MTU: 1024})
		}
		for _, c := range cfgs {
			c.Perftest, c.CM, c.Check = true, true, !noCheck
			name := fmt.Sprintf("%s -R size %d qps %d", test, c.Size, c.QPs)
			cr, sr, err := PerftestLoopback(c, DefaultAddrs, true)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			c.Defaults()
			iters := c.Iters * c.QPs
			if len(cr) != 1 || len(sr) != 1 {
				t.Fatalf("%s: client %+v, server %+v", name, cr, sr)
			}
			r, s := cr[0], sr[0]
			if !r.Perftest || !r.CM || !s.CM || r.Measured != "client" || r.Iters != iters || r.Size != c.Size || r.Checked != c.Check ||
				r.PeerVersion != ptVersion || r.Counters == nil || r.Counters.Client.TxPackets == 0 || r.BW <= 0 {
				t.Fatalf("%s: client %+v", name, r)
			}
			// The path MTU is the connection manager's: the smaller offer (loopback: 4096).
			if want := max(c.MTU, 4096); c.MTU != 0 {
				if r.MTU != c.MTU || s.MTU != c.MTU {
					t.Fatalf("%s: MTU %d and %d, want %d", name, r.MTU, s.MTU, c.MTU)
				}
			} else if r.MTU != want {
				t.Fatalf("%s: MTU %d", name, r.MTU)
			}
			switch test {
			case "write_bw", "read_bw", "atomic_bw":
				if s.Measured != "client" || s.BW != r.BW || s.Iters != iters {
					t.Fatalf("%s: server %+v, client %+v", name, s, r)
				}
			case "read_lat", "atomic_lat":
				if !s.Passive || s.Counters.Server.TxPackets == 0 {
					t.Fatalf("%s: server %+v", name, s)
				}
			default:
				if s.Measured != "server" || s.Iters != iters || s.Counters.Server.RxPackets == 0 {
					t.Fatalf("%s: server %+v", name, s)
				}
			}
			for _, k := range []verbs.Counters{r.Counters.Client, s.Counters.Server} {
				if k.Retransmits+k.NAKsSent+k.NAKsReceived+k.Timeouts+k.ICRCErrors+k.Malformed+k.UnknownQP+k.WrongSource != 0 {
					t.Fatalf("%s: counters %+v", name, k)
				}
			}
		}
	}
}

// TestPerftestCMAllSizes: -a over rdma_cm, where send_bw synchronises after each size.
func TestPerftestCMAllSizes(t *testing.T) {
	c := Config{Test: "send_bw", Iters: 5, AllSizes: true, Perftest: true, CM: true, Check: true, allUpTo: 16 << 10}
	cr, sr, err := PerftestLoopback(c, DefaultAddrs, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(cr) != 14 || len(sr) != 14 || cr[13].Size != 16<<10 {
		t.Fatalf("%d client results, %d server results", len(cr), len(sr))
	}
}

// TestServerCM: a --cm server opens its device and listens through the connection
// manager before any client comes, so that a perftest -R client, which speaks nothing
// but rdma_cm, finds it; the same server then serves, one after another, a perftest
// client over TCP (no -R) on the same device, an rperf --cm client (TCP control
// connection, QPs through its listener), and another -R client.
func TestServerCM(t *testing.T) {
	port := freeRoCEPort(t)
	own := Config{Test: "send_lat", Iters: 30, CM: true, RoCEPort: port, Check: true}
	srv, err := NewServer(own, "127.0.0.1:0", DefaultAddrs[1])
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if devs := srv.Devices(); len(devs) != 1 || devs[0] != netip.AddrPortFrom(DefaultAddrs[1], uint16(port)) {
		t.Fatalf("devices %v", devs)
	}
	ctlPort := srv.Addr().(*net.TCPAddr).Port
	cmAddr := netip.AddrPortFrom(DefaultAddrs[1], uint16(ctlPort)).String()
	clients := []struct {
		name string
		run  func() (Result, error)
	}{
		{"perftest -R", func() (Result, error) {
			rs, err := PerftestClient(Config{Test: "send_lat", Iters: 30, CM: true, RoCEPort: port, Check: true}, cmAddr, DefaultAddrs[0], true)
			return last(rs), err
		}},
		{"perftest over TCP", func() (Result, error) {
			rs, err := PerftestClient(Config{Test: "send_lat", Iters: 30, RoCEPort: port, Check: true}, srv.Addr().String(), DefaultAddrs[0], true)
			return last(rs), err
		}},
		{"rperf --cm", func() (Result, error) {
			return RunClient(Config{Test: "send_lat", Iters: 30, CM: true, Check: true}, srv.Addr().String(), DefaultAddrs[0], true)
		}},
		{"perftest -R again", func() (Result, error) {
			rs, err := PerftestClient(Config{Test: "send_lat", Iters: 30, CM: true, RoCEPort: port, Check: true}, cmAddr, DefaultAddrs[0], false)
			return last(rs), err
		}},
	}
	for _, cl := range clients {
		sc := make(chan error, 1)
		var srs []Result
		go func() {
			var err error
			srs, err = srv.ServeOne(true)
			sc <- err
		}()
		r, cerr := cl.run()
		if serr := <-sc; cerr != nil || serr != nil {
			t.Fatalf("%s: client %v, server %v", cl.name, cerr, serr)
		}
		if r.Iters != 30 || len(srs) != 1 || srs[0].Iters != 30 || !srs[0].CM && cl.name != "perftest over TCP" {
			t.Fatalf("%s: client %+v, server %+v", cl.name, r, srs)
		}
		// The server's counters are this client's, not the device's since it opened (in
		// rperf's mode the server sends them to the client).
		k := srs[0].Counters
		if cl.name == "rperf --cm" {
			k = r.Counters
		}
		if k == nil || k.Server.RxPackets == 0 || k.Server.RxPackets > 1000 {
			t.Fatalf("%s: server counters %+v", cl.name, k)
		}
	}
}

func last(rs []Result) Result {
	if len(rs) == 0 {
		return Result{}
	}
	return rs[len(rs)-1]
}

// TestPerftestCMRefused: a -R client finds no server (nothing listens on the port: the
// device answers "no listener"), and a weak-ordering server refuses a -R client (a
// standard peer has ordered mode only); both say why.
func TestPerftestCMRefused(t *testing.T) {
	port := freeRoCEPort(t)
	dev, err := verbs.OpenDevice(verbs.DeviceConfig{Addr: DefaultAddrs[1], Port: port})
	if err != nil {
		t.Fatal(err)
	}
	_, err = PerftestClient(Config{Test: "write_bw", Iters: 10, CM: true, RoCEPort: port}, netip.AddrPortFrom(DefaultAddrs[1], 1).String(), DefaultAddrs[0], false)
	dev.Close()
	if err == nil || !strings.Contains(err.Error(), "no listener") {
		t.Fatalf("no listener: %v", err)
	}
	srv, err := NewServer(Config{Test: "write_bw", CM: true, RoCEPort: port, Ordering: verbs.OrderingWeak}, "127.0.0.1:0", DefaultAddrs[1])
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	sc := make(chan error, 1)
	go func() { _, err := srv.ServeOne(false); sc <- err }()
	cmAddr := netip.AddrPortFrom(DefaultAddrs[1], uint16(srv.Addr().(*net.TCPAddr).Port)).String()
	_, cerr := PerftestClient(Config{Test: "write_bw", Iters: 10, CM: true, RoCEPort: port}, cmAddr, DefaultAddrs[0], false)
	if serr := <-sc; cerr == nil || serr == nil || !strings.Contains(serr.Error(), "ordered") {
		t.Fatalf("weak server: client %v, server %v", cerr, serr)
	}
}

// ptTranscriptR reads testdata/perftest-4.5-0.17-R/NAME.txt: the exchange's SENDs of
// perftest's -R, its client's and its server's (see the file's header).
func ptTranscriptR(t *testing.T, name string) []ptMsg {
	return readTranscript(t, filepath.Join("testdata", "perftest-4.5-0.17-R", name+".txt"))
}

// replayPeerCM plays perftest's side of a -R transcript with its comm QP (connected
// already): it sends that side's messages and checks the session's against what
// perftest sent in their place; after the first handshake (perftest's zeros) it connects
// nqp QPs through the connection manager with connect, as perftest's side does there.
func replayPeerCM(msgs []ptMsg, comm *ptComm, asClient bool, ours verbs.GID, connect func() error) error {
	reports, handshakes := 0, 0
	for i, m := range msgs {
		if m.client == asClient {
			if err := comm.send(m.b); err != nil {
				return fmt.Errorf("message %d: %w", i, err)
			}
		} else {
			got, err := comm.recv(len(m.b))
			if err != nil {
				return fmt.Errorf("message %d (%d bytes): %w", i, len(m.b), err)
			}
			switch len(m.b) {
			case ptDestBinLen:
				d, err := parsePtDestBinary(got)
				if err != nil {
					return fmt.Errorf("message %d: %w", i, err)
				}
				want, _ := parsePtDestBinary(m.b)
				if want == (ptDest{}) { // the zeros around the connections: zeros
					if d != want {
						return fmt.Errorf("message %d: %+v where perftest sends zeros", i, d)
					}
				} else if d.GID != ours || d.OutReads != want.OutReads || d.LID != 0 || d.SRQN != 0 || d.QPN == 0 || d.RKey == 0 || d.VAddr == 0 {
					return fmt.Errorf("message %d: %+v (perftest's: %+v)", i, d, want)
				}
			case 8:
				var want uint64
				if !asClient {
					r := ptFakeReport
					want = []uint64{uint64(r.Size), uint64(r.Iters), math.Float64bits(r.BWPeak), math.Float64bits(r.BW), math.Float64bits(r.MsgRate)}[reports]
				}
				if v := binary.BigEndian.Uint64(got); v != want {
					return fmt.Errorf("report message %d: %#x, want %#x", reports, v, want)
				}
				reports++
			default: // version, page and cache line size, MTU: as perftest's
				if !bytes.Equal(got, m.b) {
					return fmt.Errorf("message %d: %q, perftest sent %q", i, got, m.b)
				}
			}
		}
		// Both sides' first handshake done: perftest connects its QPs through rdma_cm.
		if len(m.b) == ptDestBinLen && !m.client {
			if handshakes++; handshakes == 1 {
				if err := connect(); err != nil {
					return fmt.Errorf("after message %d: connecting the QPs: %w", i, err)
				}
			}
		}
	}
	return nil
}

// TestPerftestTranscriptsCM runs each test's -R exchange in both roles against
// perftest's own side of the exchanges recorded with rxe, the traffic left out: every
// message must come in perftest's order and size, in perftest's form (its struct for
// the handshakes, zeros around the connections, no "done"), the connections between
// the first two handshakes.
func TestPerftestTranscriptsCM(t *testing.T) {
	for _, test := range Tests {
		msgs := ptTranscriptR(t, test)
		for _, client := range []bool{true, false} {
			role := map[bool]string{true: "client", false: "server"}[client]
			t.Run(test+"/"+role, func(t *testing.T) {
				c := Config{Test: test, Perftest: true, CM: true, Iters: 20, MTU: 1024}
				c.Defaults()
				devs, err := pairDevices(&c, DefaultAddrs, true)
				if err != nil {
					t.Fatal(err)
				}
				defer devs[0].Close()
				defer devs[1].Close()
				mine, theirs := devs[0], devs[1] // the session's device, perftest's
				const port = 18515
				lMine, err := cm.Listen(mine, port)
				if err != nil {
					t.Fatal(err)
				}
				lTheirs, err := cm.Listen(theirs, port)
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()

				// perftest's side: its comm QP, and one QP to connect at the right moment.
				comm, err := newPtComm(theirs)
				if err != nil {
					t.Fatal(err)
				}
				defer comm.close()
				pd, _ := theirs.AllocPD()
				cq, _ := theirs.CreateCQ(16, nil, 0)
				qp, err := pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
				if err != nil {
					t.Fatal(err)
				}
				var data *cm.Conn
				opts := verbs.ConnectOptions{RetryCnt: 7, RNRRetry: 7, Ordering: verbs.OrderingOrdered}
				if readOrAtomic(test) {
					opts.MaxRdAtomic = 128
				}
				peer := make(chan error, 1)
				go func() {
					peer <- func() error {
						if !client { // perftest is the client
							cn, err := cm.Dial(ctx, theirs, netip.AddrPortFrom(mine.Addr().Addr(), port), comm.qp,
								&cm.DialParams{DevicePort: mine.Addr().Port(), Options: ptCommOptions(&c)})
							if err != nil {
								return err
							}
							comm.conn = cn
							if err := replayPeerCM(msgs, comm, true, verbs.GIDFromAddr(mine.Addr().Addr()), func() error {
								data, err = cm.Dial(ctx, theirs, netip.AddrPortFrom(mine.Addr().Addr(), port), qp,
									&cm.DialParams{DevicePort: mine.Addr().Port(), Options: opts})
								return err
							}); err != nil {
								return err
							}
							// perftest's client disconnects its QPs; the comm QP goes at its exit.
							return errors.Join(data.Disconnect(), comm.conn.Disconnect())
						}
						req, err := lTheirs.Accept(ctx)
						if err != nil {
							return err
						}
						if comm.conn, err = req.Accept(comm.qp, &cm.AcceptParams{Options: ptCommOptions(&c)}); err != nil {
							return err
						}
						return replayPeerCM(msgs, comm, false, verbs.GIDFromAddr(mine.Addr().Addr()), func() error {
							req, err := lTheirs.Accept(ctx)
							if err == nil {
								data, err = req.Accept(qp, &cm.AcceptParams{Options: opts})
							}
							return err
						})
					}()
				}()
				stub := func(int) (Result, error) { return ptFakeReport, nil }
				var rs []Result
				if client {
					rs, err = perftestDialCM(&c, mine, netip.AddrPortFrom(theirs.Addr().Addr(), port), false, stub)
				} else {
					req, aerr := lMine.Accept(ctx)
					if aerr != nil {
						t.Fatal(aerr)
					}
					rs, err = perftestAcceptCM(&c, mine, lMine, req, false, stub)
				}
				if perr := <-peer; err != nil || perr != nil {
					t.Fatalf("session: %v; perftest's side: %v", err, perr)
				}
				// The session's client disconnected its connections; its server waited for
				// perftest's client to.
				if client && (data == nil || comm.conn == nil || data.Err() == nil || comm.conn.Err() == nil) {
					t.Fatalf("connections still up after the client's session: data %v, comm %v", data, comm.conn)
				}
				if len(rs) != 1 || rs[0].Passive != (!client && (test == "read_lat" || test == "atomic_lat")) || !rs[0].CM {
					t.Fatalf("%d results: %+v", len(rs), rs)
				}
			})
		}
	}
}

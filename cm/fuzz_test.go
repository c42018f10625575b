package cm

import (
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/gsiport"
	"github.com/softrnic/softrnic/internal/mad"
	"github.com/softrnic/softrnic/internal/verbstest"
	"github.com/softrnic/softrnic/verbs"
)

// FuzzHandleMAD drives QP1's receive path, the connection manager's HandleMAD, with
// hostile MAD sequences from two senders: one the peer of a connection this side is
// dialing (so that REP, MRA, REJ, DREQ can match it), one a stranger. Whatever arrives,
// nothing panics, state stays bounded by what was received, every answer is a
// well-formed CM MAD sent to the device that asked, and a stranger's MADs never touch
// the dialing connection.
func FuzzHandleMAD(f *testing.F) {
	const id = 0x11223344 // the dialing connection's communication ID
	put := func(who byte, m mad.Message) []byte {
		b := make([]byte, 1+mad.Size)
		b[0] = who
		mad.Put(b[1:], 9, m)
		return b
	}
	cat := func(bs ...[]byte) []byte {
		var out []byte
		for _, b := range bs {
			out = append(out, b...)
		}
		return out
	}
	req := &mad.REQ{LocalCommID: 77, ServiceID: mad.ServiceID(testPort), LocalQPN: 0x99, TransportType: mad.TransportRC,
		PathMTU: 3, MaxCMRetries: 2, LocalCMResponseTimeout: 16}
	h := mad.CMAHeader{SrcPort: 1, Src: netip.MustParseAddr("127.0.0.1"), Dst: netip.MustParseAddr("127.0.0.2")}
	h.Put(req.PrivateData[:])
	rep := &mad.REP{LocalCommID: 5, RemoteCommID: id, LocalQPN: 0x42, StartingPSN: 7, ResponderResources: 4, LocalEECN: ext(verbs.OrderingWeak, 128, verbs.MTU2048)}
	f.Add(put(0, req))
	f.Add(cat(put(0, req), put(0, req), put(0, &mad.REJ{LocalCommID: 77, Reason: mad.RejTimeout})))
	f.Add(cat(put(0, rep), put(0, rep), put(0, &mad.DREQ{LocalCommID: 5, RemoteCommID: id, RemoteQPN: 0})))
	f.Add(cat(put(0, &mad.MRA{RemoteCommID: id, ServiceTimeout: 31}), put(1, rep)))
	f.Add(cat(put(0, &mad.REJ{RemoteCommID: id, Reason: mad.RejConsumerReject}), put(0, &mad.DREP{LocalCommID: 5, RemoteCommID: id})))
	f.Add(cat(put(1, &mad.RTU{LocalCommID: 77, RemoteCommID: 1}), put(1, &mad.DREQ{LocalCommID: 1, RemoteCommID: 2})))
	cpi := make([]byte, 1+mad.Size)
	mad.PutClassPortInfoGet(cpi[1:], 3)
	f.Add(cpi)
	// The peer answers the REQ, then shows another incarnation (it restarted).
	repInc := *rep
	repInc.LocalCAGUID = 0x51
	restarted := make([]byte, 1+mad.Size)
	mad.PutClassPortInfoResp(restarted[1:], 3, 16)
	mad.PutIncarnation(restarted[1:], 0x53)
	f.Add(cat(put(0, &repInc), restarted))

	dev, pd, cq := fuzzDevice(f)
	senders := [2]netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:4791"), netip.MustParseAddrPort("127.0.0.9:4791")}
	f.Fuzz(func(t *testing.T, data []byte) {
		port := &recordPort{local: netip.MustParseAddrPort("127.0.0.2:4791")}
		m := newManager(dev, port)
		l := &Listener{m: m, port: testPort, backlog: make(chan *conn, 8), closed: make(chan struct{})}
		m.listeners[testPort] = l
		qp, err := pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			t.Fatal(err)
		}
		defer qp.DestroyQP()
		if err := InitQP(qp, 0); err != nil {
			t.Fatal(err)
		}
		// The connection this side is dialing, REQ sent to senders[0].
		m.mu.Lock()
		c := &conn{m: m, id: id, active: true, peer: senders[0], ready: make(chan struct{}), done: make(chan struct{}),
			qp: qp, params: verbs.ConnectOptions{}.WithDefaults(), timeout: time.Hour, maxRetries: 1, keepAlive: -1, state: stReqSent}
		m.ids[id] = c
		m.mu.Unlock()
		defer func() {
			m.mu.Lock()
			m.closed = true // timers armed by the input do nothing when they fire
			for _, c := range m.ids {
				c.stopTimer()
			}
			m.mu.Unlock()
		}()
		msgs, peerSent := 0, false
		for len(data) > 0 && msgs < 8 {
			n := min(len(data)-1, mad.Size)
			if n < 0 {
				break
			}
			from := senders[data[0]&1]
			b := make([]byte, n) // a short datagram is not a MAD; QP1 only passes MAD-sized ones
			copy(b, data[1:1+n])
			if n == mad.Size {
				m.HandleMAD(from, 1+uint32(data[0]>>7), b)
			}
			data = data[1+n:]
			msgs++
			peerSent = peerSent || from == senders[0]
		}
		if !peerSent && c.state != stReqSent {
			t.Fatalf("a stranger's MADs moved the dialing connection to state %d", c.state)
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		if len(m.ids) > 1+msgs || len(l.backlog) > msgs || len(m.peers) > 1 || len(m.incs) > 2 {
			t.Fatalf("%d messages left %d connections, %d requests in the backlog, %d peers, %d incarnations",
				msgs, len(m.ids), len(l.backlog), len(m.peers), len(m.incs))
		}
		port.mu.Lock()
		defer port.mu.Unlock()
		for _, s := range port.sent {
			if s.to != senders[0] && s.to != senders[1] {
				t.Fatalf("sent a MAD to %v, which sent nothing", s.to)
			}
			if _, err := mad.DecodeHeader(s.b); err != nil {
				t.Fatalf("sent a malformed MAD: %v", err)
			}
		}
	})
}

// fuzzDevice opens the one device the fuzz target's QPs live on.
func fuzzDevice(f *testing.F) (*verbs.Device, *verbs.PD, *verbs.CQ) {
	fuzzDev.once.Do(func() {
		d, err := verbs.OpenDevice(verbs.DeviceConfig{Addr: verbstest.IPA, Port: verbs.AnyPort, Faults: &verbs.Faults{}})
		if err != nil {
			fuzzDev.err = err
			return
		}
		fuzzDev.dev = d
		fuzzDev.pd, fuzzDev.err = d.AllocPD()
		if fuzzDev.err == nil {
			fuzzDev.cq, fuzzDev.err = d.CreateCQ(64, nil, 0)
		}
	})
	if fuzzDev.err != nil {
		f.Fatal(fuzzDev.err)
	}
	return fuzzDev.dev, fuzzDev.pd, fuzzDev.cq
}

var fuzzDev struct {
	once sync.Once
	dev  *verbs.Device
	pd   *verbs.PD
	cq   *verbs.CQ
	err  error
}

// recordPort is a QP1 that records what is sent instead of sending it.
type recordPort struct {
	local netip.AddrPort
	mu    sync.Mutex
	sent  []sentMAD
}

type sentMAD struct {
	to netip.AddrPort
	b  []byte
}

func (p *recordPort) SendMAD(dst netip.AddrPort, _ uint32, m []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.sent) < 64 {
		p.sent = append(p.sent, sentMAD{dst, append([]byte(nil), m...)})
	}
	return nil
}
func (p *recordPort) LocalAddr() netip.AddrPort   { return p.local }
func (p *recordPort) Claim(gsiport.Handler) error { return nil }
func (p *recordPort) Incarnation() uint64         { return 0x5eed }

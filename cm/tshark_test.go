package cm

import (
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/softrnic/softrnic/internal/gsiport"
	"github.com/softrnic/softrnic/internal/mad"
	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/internal/verbstest"
	"github.com/softrnic/softrnic/internal/wire"
	"github.com/softrnic/softrnic/internal/wire/wiretest"
	"github.com/softrnic/softrnic/verbs"
)

// tapPort is a device's QP1 with every MAD it sends recorded as the RoCEv2 frame that
// carries it (a UD SEND to QP1 with the GSI Q_Key).
type tapPort struct {
	gsiport.Port
	mu     *sync.Mutex // shared by the taps of one test
	frames *[][]byte
}

func (p *tapPort) SendMAD(dst netip.AddrPort, qpn uint32, m []byte) error {
	src := p.LocalAddr()
	fl := wiretest.Flow(src, dst)
	pkt := wiretest.Build(&fl, wire.BTH{Opcode: wire.OpUDSendOnly, PKey: wire.DefaultPKey, DestQP: qpn}, func(hdr []byte) {
		d := wire.DETH{QKey: mad.GSIQKey, SrcQP: 1}
		d.Put(hdr[wire.BTHLen:])
	}, m)
	p.mu.Lock()
	*p.frames = append(*p.frames, wiretest.Frame(src, dst, pkt))
	p.mu.Unlock()
	return p.Port.SendMAD(dst, qpn, m)
}

// tap installs a connection manager on dev whose sends are recorded into frames.
func tap(t *testing.T, dev *verbs.Device, mu *sync.Mutex, frames *[][]byte) {
	t.Helper()
	port, err := gsiport.Lookup(dev)
	if err != nil {
		t.Fatal(err)
	}
	m := newManager(dev, &tapPort{Port: port, mu: mu, frames: frames})
	if err := port.Claim(m); err != nil {
		t.Fatal(err)
	}
	managersMu.Lock()
	managers[dev] = m
	managersMu.Unlock()
}

// Wireshark's InfiniBand dissector, which nobody here wrote, reads the MADs of real
// handshakes (connect with MRA, reject, disconnect) as CM messages with nothing
// malformed.
func TestTsharkDecodesHandshake(t *testing.T) {
	da, db := devs(t, verbs.DeviceConfig{})
	var mu sync.Mutex
	var frames [][]byte
	tap(t, da, &mu, &frames)
	tap(t, db, &mu, &frames)
	a, b := newEndpoint(t, da, 1), newEndpoint(t, db, 1)
	ca, _ := handshake(t, a, b, fast([]byte("hello")), &AcceptParams{PrivateData: []byte("welcome")})
	if err := ca.DisconnectContext(testutil.Context(t)); err != nil {
		t.Fatal(err)
	}
	a2 := newEndpoint(t, da, 0)
	l, _ := Listen(db, testPort+1)
	defer l.Close()
	go func() {
		if r, err := l.Accept(testutil.Context(t)); err == nil {
			r.Reject([]byte("no"))
		}
	}()
	p := fast(nil)
	p.DevicePort = db.Addr().Port()
	Dial(testutil.Context(t), da, netip.AddrPortFrom(db.Addr().Addr(), testPort+1), a2.QP, p)
	verbstest.Settle(da, db)

	mu.Lock()
	captured := append([][]byte(nil), frames...)
	mu.Unlock()
	// The devices use ephemeral UDP ports: decode them as RoCEv2, as 4791 is.
	run := wiretest.Tshark(t, captured, da.Addr().Port(), db.Addr().Port())
	wiretest.NoMalformed(t, run)
	seen := map[string]bool{}
	for _, a := range strings.Fields(run("-T", "fields", "-e", "infiniband.mad.attributeid")) {
		seen[a] = true
	}
	for _, want := range []mad.AttrID{mad.AttrREQ, mad.AttrREP, mad.AttrRTU, mad.AttrDREQ, mad.AttrDREP, mad.AttrREJ} {
		if !seen[fmt.Sprintf("0x%04x", uint16(want))] {
			t.Errorf("tshark saw no %v among the CM attributes %v", want, seen)
		}
	}
}

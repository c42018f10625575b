package rsocket

import (
	"encoding/binary"
	"sync"
	"testing"

	"github.com/softrnic/softrnic/internal/verbstest"
	"github.com/softrnic/softrnic/verbs"
)

// FuzzConnData parses arbitrary connect blocks: a block that is taken encodes back to
// the same bytes (but the reserved ones and the iomap scale's lost precision).
func FuzzConnData(f *testing.F) {
	good := make([]byte, connDataLen)
	(&connData{Version: 1, Flags: flagIOMap, Credits: 384, Target: sge{1, 2, 2}, DataBuf: sge{3, 4, 65536}}).put(good)
	f.Add(good)
	f.Add(make([]byte, 56))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := parseConnData(b)
		if err != nil {
			return
		}
		out := make([]byte, connDataLen)
		d.put(out)
		again, err := parseConnData(out)
		if err != nil || again != d {
			t.Fatalf("re-encoded %+v parses as %+v, %v", d, again, err)
		}
	})
}

var (
	fuzzOnce sync.Once
	fuzzConn *Conn
)

// FuzzReceive feeds a connection arbitrary completions from its peer, as a hostile peer
// can make them (any immediate, any length, any grant written into the target area),
// between reads of what was taken: nothing panics, and what a Read would be handed is
// always inside the ring, what the peer was granted.
//
// Each record of the input is 9 bytes: the immediate (4), the byte count (4), and a
// byte whose low bits say how much to read after it; a record for a 16-byte grant is
// followed by the 16 bytes the peer wrote into the target slot, one for a 24-byte iomap
// entry by the entry.
func FuzzReceive(f *testing.F) {
	rec := func(imm, n uint32, read byte, grant ...byte) []byte {
		b := binary.BigEndian.AppendUint32(nil, imm)
		b = binary.BigEndian.AppendUint32(b, n)
		return append(append(b, read), grant...)
	}
	grant := make([]byte, sgeLen)
	putSGE(grant, sge{Addr: 0x1000, Key: 7, Len: 4096}, false)
	var seed []byte
	seed = append(seed, rec(imm(opData, 100), 100, 1)...)
	seed = append(seed, rec(imm(opSGL, 40), sgeLen, 0, grant...)...)
	seed = append(seed, rec(imm(opData, 4000), 4000, 0xFF)...)
	seed = append(seed, rec(imm(opCtrl, ctrlShutdown), 0, 0xFF)...)
	f.Add(seed)
	f.Add(rec(imm(opData, 1<<29-1), 1<<29-1, 0))
	f.Add(rec(imm(opData, 8193), 8193, 3))
	f.Fuzz(func(t *testing.T, in []byte) {
		fuzzOnce.Do(func() {
			// One device and connection for the whole run (never connected: only its
			// state and memory are used).
			dev, err := verbs.OpenDevice(verbs.DeviceConfig{Addr: verbstest.IPA, Port: verbs.AnyPort, Faults: &verbs.Faults{}})
			if err != nil {
				t.Fatal(err)
			}
			o, _ := Options{RecvBuffer: 16 << 10, SendBuffer: 4 << 10, QueueSize: 16, IOMapSize: 2}.withDefaults()
			c, err := newConn(dev, o)
			if err != nil {
				t.Fatal(err)
			}
			fuzzConn = c
		})
		c := fuzzConn
		c.mu.Lock()
		defer c.mu.Unlock()
		c.initState()
		c.tx.grants[0], c.tx.gN = sge{Addr: 1, Key: 1, Len: 8192}, 1
		c.iomaps = make([]ioEntry, c.o.IOMapSize)
		for len(in) >= 9 {
			wc := verbs.WorkCompletion{WRID: wrRecv, Opcode: verbs.WCRecvRDMAWithImm,
				ImmData: binary.BigEndian.Uint32(in), ByteLen: binary.BigEndian.Uint32(in[4:])}
			read := in[8]
			in = in[9:]
			if wc.ByteLen == sgeLen && len(in) >= sgeLen {
				copy(c.target.Buf()[sgeLen*c.tx.nextSlot:], in[:sgeLen])
				in = in[sgeLen:]
			}
			if op, v := immOp(wc.ImmData); op == opIOMapSGL && wc.ByteLen == iomapLen && v < 2 && len(in) >= iomapLen {
				copy(c.target.Buf()[grantSlots*sgeLen+iomapLen*int(v):], in[:iomapLen])
				in = in[iomapLen:]
			}
			c.onRecv(&wc)
			check(t, c)
			// Read some of what was taken, and give credits as a Read would.
			for k := read & 3; k > 0; k-- {
				off, n := c.rx.readable()
				if n == 0 {
					break
				}
				if read&4 != 0 {
					n = min(n, uint32(read))
				}
				_ = c.ring.Buf()[off : off+n]
				c.rx.consume(n)
				var wr verbs.SendWR
				if c.creditsLocked(&wr) {
					c.ctrlAvail++ // as if its completion came at once
				}
				check(t, c)
			}
		}
	})
}

// check holds the receive state's invariants.
func check(t *testing.T, c *Conn) {
	r, tx := &c.rx, &c.tx
	if off, n := r.readable(); off+n > r.size {
		t.Fatalf("readable [%d, %d) outside a ring of %d", off, off+n, r.size)
	}
	if r.n < 0 || r.n > len(r.lens) || r.granted > r.size || r.wpos >= r.size || r.avail > r.size {
		t.Fatalf("receive state out of bounds: %+v", *r)
	}
	var unread uint32
	for i := 0; i < r.n; i++ {
		unread += r.lens[(r.head+i)%len(r.lens)]
	}
	if unread-r.partial+r.granted+r.avail > r.size {
		t.Fatalf("unread %d + granted %d + free %d exceed the ring (%d)", unread-r.partial, r.granted, r.avail, r.size)
	}
	if tx.gN < 0 || tx.gN > grantSlots {
		t.Fatalf("%d grants held", tx.gN)
	}
}

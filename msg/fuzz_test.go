package msg

import (
	"encoding/binary"
	"testing"

	"github.com/softrnic/softrnic/internal/testutil"
)

// FuzzSlot drives a rank's receive path with what a hostile peer can put there: any
// immediate data and any bytes in the slot it names (header, lengths, kinds, IDs,
// phases, credits). Nothing panics; a bad slot ends the connection, never the rank.
func FuzzSlot(f *testing.F) {
	put := func(h header, payload []byte, v uint32) []byte {
		b := make([]byte, 4+hdrLen+len(payload))
		binary.LittleEndian.PutUint32(b, v)
		h.put(b[4:])
		copy(b[4+hdrLen:], payload)
		return b
	}
	f.Add(put(header{Kind: kindData, Len: 5, Total: 5, Tag: 3}, []byte("hello"), imm(immSlot, 0, 1, 0)))
	f.Add(put(header{Kind: kindRTS, Total: 1 << 62, ID: 7}, nil, imm(immSlot, 0, 0, 0)))
	f.Add(put(header{Kind: kindRTS, Total: 5000, ID: 7}, nil, imm(immSlot, 0, 1023, 0)))
	f.Add(put(header{Kind: kindCTS, ID: 9, Total: 1 << 40, Addr: 1, RKey: 2}, nil, imm(immSlot, 0, 0, 0)))
	f.Add(put(header{Kind: kindFIN, ID: 1}, nil, imm(immSlot, 0, 0, 0)))
	f.Add(put(header{Kind: kindEnlarge, Phase: 9, ID: 1}, nil, imm(immSlot, 0, 0, 0)))
	f.Add(put(header{Kind: kindData, Len: 1 << 30}, nil, imm(immSlot, 0, 0, 5)))
	f.Add(put(header{}, nil, imm(immAckResend, 1, 0, 2)))
	// One job for every input, connected as by a first message.
	comms := newJob(f, 2, Config{})
	if err := comms[1].Send(testutil.Context(f), []byte("hi"), 0, 1); err != nil {
		f.Fatal(err)
	}
	if _, err := comms[0].Recv(testutil.Context(f), make([]byte, 2), 1, 1); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 4 {
			return
		}
		c := comms[0]
		v := binary.LittleEndian.Uint32(data)
		c.call(func() {
			p, err := c.peer(1)
			if err != nil || p.ring == nil {
				return
			}
			size := c.cfg.Phases[p.phase]
			slot := int(p.recvSeq % uint64(c.cfg.Slots))
			copy(p.ring.Buf()[slot*size:(slot+1)*size], data[4:])
			p.known = true // as after the handshake: answers go to its (zero) areas
			p.onImm(v)
		})
	})
}

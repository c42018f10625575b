package transport

import (
	"encoding/binary"
	"testing"

	"github.com/softrnic/softrnic/internal/wire"
)

// FuzzPortUnreachable feeds a QP with a request outstanding reports whose quote is any
// bytes (a forged ICMP message quotes what its forger likes): none may panic, and the QP
// fails only for a quote of an unacknowledged request it sent, to its peer's QP.
func FuzzPortUnreachable(f *testing.F) {
	req := make([]byte, wire.BTHLen+wire.RETHLen)
	bth := wire.BTH{Opcode: wire.OpSendOnly, PKey: wire.DefaultPKey, DestQP: rigPeerQPN, PSN: 0x100}
	bth.Put(req)
	f.Add(req, false)
	f.Add(req[:wire.BTHLen-1], false)
	f.Add([]byte{byte(wire.OpAcknowledge), 0, 0xff, 0xff, 0, 0x0a, 0xbc, 0xde, 0, 0, 1, 0}, true)
	f.Fuzz(func(t *testing.T, quote []byte, otherPeer bool) {
		rg := newQPRig(t, newRigConfig(Ordered))
		_, mb := rg.mem(64)
		rg.post(SendWR{WRID: 1, Opcode: WRSend, Flags: FlagSignaled, SG: []SGE{sge(mb, 0, 8)}})
		rg.sent()
		dst := rigPeer
		if otherPeer {
			dst = rigLocal
		}
		u := rg.d.q0()
		u.rxMu.Lock()
		rg.d.portUnreachable(dst, quote)
		u.rxMu.Unlock()
		failed := rg.qp.State() == StateErr
		legit := !otherPeer && len(quote) >= wire.BTHLen &&
			wire.Opcode(quote[0]).Info().Valid && wire.Opcode(quote[0]).Info().Flags&wire.IsRequest != 0 &&
			wire.Opcode(quote[0]).Info().Flags&wire.IsUD == 0 &&
			binary.BigEndian.Uint32(quote[4:8])&0xFFFFFF == rigPeerQPN &&
			binary.BigEndian.Uint32(quote[8:12])&uint32(wire.PSNMask) == 0x100
		if failed && !legit {
			t.Fatalf("a report quoting % x (to the rig's peer: %v) failed the QP", quote, !otherPeer)
		}
		if legit && !failed {
			t.Fatalf("a report quoting the outstanding request (% x) left the QP in %v", quote, rg.qp.State())
		}
	})
}

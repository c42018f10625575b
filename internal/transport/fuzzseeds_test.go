package transport

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/softrnic/softrnic/internal/wire"
	"github.com/softrnic/softrnic/internal/wire/wiretest"
)

// seedPkt is a packet record in the form buildPacket reads it.
type seedPkt struct {
	ctl    byte
	op     wire.Opcode
	fl     byte
	psnd   byte
	destQP []byte // with ctl bit 5
	pkey   []byte // with ctl bit 6
	pm     []byte // payload length byte (and u16)
	fill   byte
	ext    []byte // extended-header fields, in the order buildPacket reads them
	raw    []byte // kinds 6 and 7
}

func (s seedPkt) encode(ops []wire.Opcode) []byte {
	b := []byte{s.ctl}
	if s.ctl&7 >= 6 {
		return append(append(b, byte(len(s.raw))), s.raw...)
	}
	idx := -1
	for i, o := range ops {
		if o == s.op {
			idx = i
		}
	}
	if idx < 0 {
		b = append(b, 0xF0, byte(s.op))
	} else {
		b = append(b, byte(idx))
	}
	b = append(b, s.fl, s.psnd)
	b = append(b, s.destQP...)
	b = append(b, s.pkey...)
	pm := s.pm
	if pm == nil {
		pm = []byte{0}
	}
	b = append(b, pm...)
	b = append(b, s.fill)
	return append(b, s.ext...)
}

func (s seedPkt) withExt(ext []byte) seedPkt { s.ext = ext; return s }
func (s seedPkt) withPSN(d int) seedPkt      { s.psnd = psnDelta(d); return s }

// Field encoders for seeds.
func psnDelta(d int) byte {
	if d == 0 {
		return 0
	}
	return 0x80 | byte(d)&0x7F
}
func plSmall(n int) []byte   { return []byte{byte(n)} } // 0..63
func plMTU() []byte          { return []byte{0x40} }
func plMTUPlus(k int) []byte { return []byte{0x80 | byte(k+32)} } // -32..31
func plBig(n int) []byte     { return []byte{0xC0, byte(n >> 8), byte(n)} }
func vaBase8(sel, k byte) []byte {
	return []byte{0x08 | sel, k}
}
func vaOff(sel byte, off int16) []byte   { return []byte{sel, byte(uint16(off) >> 8), byte(off)} }
func vaEnd(sel byte, back uint16) []byte { return []byte{0x04 | sel, byte(back >> 8), byte(back)} }
func vaRaw(sel byte, va uint64) []byte {
	b := []byte{0x0C | sel, 0, 0, 0, 0, 0, 0, 0, 0}
	putBE64(b[1:], va)
	return b
}
func lenPL() []byte               { return []byte{0x00} }
func len16(n int) []byte          { return []byte{0x40, byte(n >> 8), byte(n)} }
func lenMTU(k, extra byte) []byte { return []byte{0x80 | k | extra<<2} }
func len32(n uint32) []byte {
	b := []byte{0xC0, 0, 0, 0, 0}
	putBE32(b[1:], n)
	return b
}
func aethAck(msn byte) []byte      { return []byte{0x00, msn} }
func aethSyn(syn, msn byte) []byte { return []byte{0x80, syn, msn} }
func cat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

// TestWriteFuzzSeeds writes the seed corpora of FuzzReceivePath, FuzzRequesterResponses,
// FuzzWeakReceivePath and FuzzWeakRequesterResponses into testdata/fuzz/. It only runs with SOFTRNIC_WRITE_FUZZ_SEEDS=1.
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("SOFTRNIC_WRITE_FUZZ_SEEDS") != "1" {
		t.Skip("set SOFTRNIC_WRITE_FUZZ_SEEDS=1 to regenerate testdata/fuzz")
	}
	write := func(target string, seeds map[string][]byte) {
		dir := filepath.Join("testdata", "fuzz", target)
		// Keep the inputs the fuzzer found (regression-*): the generator cannot make them.
		must(t, wiretest.ClearSeeds(dir))
		must(t, os.MkdirAll(dir, 0o755))
		for name, data := range seeds {
			must(t, os.WriteFile(filepath.Join(dir, name), wiretest.CorpusFile(data), 0o644))
		}
		t.Logf("%s: %d seeds", target, len(seeds))
	}
	prog := func(ops []wire.Opcode, hdr []byte, pkts ...seedPkt) []byte {
		b := append([]byte(nil), hdr...)
		for _, p := range pkts {
			b = append(b, p.encode(ops)...)
		}
		return b
	}

	// FuzzReceivePath: header h0, h1, RQ PSN.
	rh := func(h0, h1 byte, psn wire.PSN) []byte {
		return []byte{h0, h1, byte(psn >> 16), byte(psn >> 8), byte(psn)}
	}
	rx := func(hdr []byte, pkts ...seedPkt) []byte { return prog(fuzzAllOps, hdr, pkts...) }
	def := rh(0, 0, 0)
	wOnly := func(n int, va []byte) seedPkt {
		return seedPkt{op: wire.OpWriteOnly, pm: plSmall(n), fill: 0x11, ext: cat(va, lenPL())}
	}
	read := func(va []byte, n int) seedPkt { return seedPkt{op: wire.OpReadRequest, ext: cat(va, len16(n))} }
	fadd := func(va []byte, add byte) seedPkt { return seedPkt{op: wire.OpFetchAdd, ext: cat(va, []byte{add, 0})} }
	cswap := func(va []byte, swap, cmp byte) seedPkt {
		return seedPkt{op: wire.OpCompareSwap, ext: cat(va, []byte{swap, cmp})}
	}
	send := func(op wire.Opcode, pm []byte) seedPkt { return seedPkt{op: op, pm: pm, fill: 0x30} }
	rxSeeds := map[string][]byte{
		"empty":                 {},
		"header-only":           def,
		"write-only":            rx(def, wOnly(32, vaBase8(0, 4))),
		"write-first-mid-last":  rx(def, seedPkt{op: wire.OpWriteFirst, pm: plMTU(), fill: 1, ext: cat(vaBase8(0, 0), lenMTU(2, 0))}, seedPkt{op: wire.OpWriteMiddle, pm: plMTU(), fill: 2}, seedPkt{op: wire.OpWriteLast, pm: plMTU(), fill: 3}),
		"write-first-mid-short": rx(def, seedPkt{op: wire.OpWriteFirst, pm: plMTU(), fill: 1, ext: cat(vaBase8(0, 2), lenMTU(1, 5))}, seedPkt{op: wire.OpWriteMiddle, pm: plMTU(), fill: 2}, seedPkt{op: wire.OpWriteLastImm, pm: plSmall(5), fill: 3, ext: []byte{9}}),
		"write-past-end":        rx(def, wOnly(32, vaEnd(0, 16))),
		"write-before-start":    rx(def, wOnly(16, vaOff(0, -8))),
		"write-read-only-mr":    rx(def, wOnly(16, vaBase8(1, 1))),
		"write-other-pd":        rx(def, wOnly(16, vaBase8(2, 1))),
		"write-local-only-mr":   rx(def, wOnly(16, vaBase8(3, 1))),
		"write-other-key":       rx(def, wOnly(16, []byte{0x28, 1})),
		"write-stale-key":       rx(def, wOnly(16, []byte{0x88, 1})),
		"write-len-mismatch":    rx(def, seedPkt{op: wire.OpWriteOnly, pm: plSmall(32), ext: cat(vaBase8(0, 0), len16(64))}),
		"write-huge-dmalen":     rx(def, seedPkt{op: wire.OpWriteFirst, pm: plMTU(), ext: cat(vaBase8(0, 0), len32(0xFFFFFFFF))}),
		"write-zero-length":     rx(def, seedPkt{op: wire.OpWriteOnly, ext: cat(vaRaw(0, 0xdeadbeef00), len16(0))}),
		"write-imm":             rx(def, seedPkt{op: wire.OpWriteOnlyImm, pm: plSmall(8), fill: 5, ext: cat(vaBase8(0, 2), lenPL(), []byte{0x42})}),
		"write-imm-no-wqe":      rx(rh(0xC0, 0, 0), seedPkt{op: wire.OpWriteOnlyImm, pm: plSmall(8), ext: cat(vaBase8(0, 2), lenPL(), []byte{1})}, seedPkt{op: wire.OpWriteOnlyImm, pm: plSmall(8), ext: cat(vaBase8(0, 2), lenPL(), []byte{1})}),
		"read":                  rx(def, read(vaBase8(0, 0), 768), seedPkt{op: wire.OpReadRequest, psnd: psnDelta(-3), ext: cat(vaBase8(0, 0), len16(768))}, read(vaEnd(0, 100), 100)),
		"read-dup-middle":       rx(def, read(vaBase8(0, 0), 1000), seedPkt{op: wire.OpReadRequest, psnd: psnDelta(-2), ext: cat(vaBase8(0, 64), len16(488))}),
		"read-past-end":         rx(def, read(vaEnd(0, 50), 100)),
		"read-read-only-mr":     rx(def, read(vaBase8(1, 0), 300)),
		"read-other-pd":         rx(def, read(vaBase8(2, 0), 64)),
		"read-zero":             rx(def, read(vaRaw(0, 1), 0)),
		"read-max-dest-0":       rx(rh(0, 0x10, 0), read(vaBase8(0, 0), 64)),
		"read-ring-overflow":    rx(rh(0, 0x0F, 0), seedPkt{ctl: 0x08, op: wire.OpReadRequest, ext: cat(vaBase8(0, 0), len16(600))}, seedPkt{ctl: 0x08, op: wire.OpReadRequest, ext: cat(vaBase8(0, 1), len16(600))}, read(vaBase8(0, 2), 600), seedPkt{op: wire.OpReadRequest, psnd: psnDelta(-6), ext: cat(vaBase8(0, 0), len16(600))}),
		"atomics":               rx(def, fadd(vaBase8(0, 1), 5), cswap(vaBase8(0, 1), 0x7F, 5), seedPkt{op: wire.OpFetchAdd, psnd: psnDelta(-2), ext: cat(vaBase8(0, 1), []byte{5, 0})}, fadd(vaBase8(0, 2), 1)),
		"atomic-misaligned":     rx(def, fadd([]byte{0x48, 1}, 1)),
		"atomic-past-end":       rx(def, fadd(vaEnd(0, 4), 1)),
		"atomic-read-only-mr":   rx(def, cswap(vaBase8(1, 0), 1, 0)),
		"atomic-big-values":     rx(def, seedPkt{op: wire.OpCompareSwap, ext: cat(vaBase8(0, 3), []byte{0x80, 1, 2, 3, 4, 5, 6, 7, 8, 0x80, 0, 0, 0, 0, 0, 0, 0, 0})}),
		"send-only":             rx(def, send(wire.OpSendOnly, plSmall(50)), send(wire.OpSendOnlyImm, plSmall(0)).withExt([]byte{7})),
		"send-first-last":       rx(def, send(wire.OpSendFirst, plMTU()), send(wire.OpSendLast, plBig(100))),
		"send-too-long":         rx(def, send(wire.OpSendFirst, plMTU()), send(wire.OpSendMiddle, plMTU()), send(wire.OpSendLast, plSmall(1))),
		"send-two-sges":         rx(rh(0, 0x40, 0), send(wire.OpSendFirst, plMTU()), send(wire.OpSendLastImm, plBig(144)).withExt([]byte{3}), send(wire.OpSendOnly, plSmall(63))),
		"send-bad-wqe":          rx(rh(0, 0x20, 0), send(wire.OpSendOnly, plSmall(20))),
		"send-rnr":              rx(rh(0xC0, 0, 0), send(wire.OpSendOnly, plSmall(20)), send(wire.OpSendOnly, plSmall(20))),
		"send-invalidate":       rx(def, send(wire.OpSendOnlyInvalidate, plSmall(4)).withExt([]byte{0})),
		"srq":                   rx(rh(0, 0x80, 0), send(wire.OpSendOnly, plSmall(20)), send(wire.OpSendFirst, plMTU()), seedPkt{op: wire.OpWriteOnly, ext: cat(vaBase8(0, 0), lenPL())}),
		"psn-ahead":             rx(def, seedPkt{op: wire.OpWriteOnly, psnd: psnDelta(5), pm: plSmall(4), ext: cat(vaBase8(0, 0), lenPL())}, wOnly(4, vaBase8(0, 0))),
		"write-duplicate":       rx(def, wOnly(4, vaBase8(0, 0)), seedPkt{op: wire.OpWriteOnly, psnd: psnDelta(-1), pm: plSmall(4), ext: cat(vaBase8(0, 0), lenPL())}),
		"opcode-sequence":       rx(def, seedPkt{op: wire.OpWriteMiddle, pm: plMTU()}),
		"send-then-write":       rx(def, send(wire.OpSendFirst, plMTU()), wOnly(4, vaBase8(0, 0))),
		"psn-wrap":              rx(rh(0, 0, 0xFFFFFE), seedPkt{op: wire.OpWriteFirst, pm: plMTU(), ext: cat(vaBase8(0, 0), lenMTU(2, 0))}, seedPkt{op: wire.OpWriteMiddle, pm: plMTU()}, seedPkt{op: wire.OpWriteLast, pm: plMTU()}, read(vaBase8(0, 0), 512)),
		"no-flush-batch":        rx(def, seedPkt{ctl: 0x08, op: wire.OpWriteOnly, pm: plSmall(4), ext: cat(vaBase8(0, 0), lenPL())}, seedPkt{ctl: 0x08, op: wire.OpReadRequest, ext: cat(vaBase8(0, 0), len16(300))}, seedPkt{ctl: 0x08, op: wire.OpFetchAdd, ext: cat(vaBase8(0, 0), []byte{1, 0})}, seedPkt{ctl: 0x08, op: wire.OpSendOnly, pm: plSmall(4)}),
		"rtr":                   rx(rh(0x20, 0, 0), wOnly(16, vaBase8(0, 0)), send(wire.OpSendOnly, plSmall(3))),
		"qp-without-rights":     rx(rh(0x1C, 0, 0), wOnly(16, vaBase8(0, 0)), read(vaBase8(0, 0), 16), fadd(vaBase8(0, 0), 1)),
		"mtu-1024":              rx(rh(2, 0, 0), seedPkt{op: wire.OpWriteFirst, pm: plMTU(), ext: cat(vaBase8(0, 0), lenMTU(0, 9))}, seedPkt{op: wire.OpWriteLast, pm: plSmall(9)}),
		"response-to-responder": rx(def, seedPkt{op: wire.OpAcknowledge, ext: aethAck(0)}, seedPkt{op: wire.OpReadResponseOnly, pm: plSmall(8), ext: aethAck(0)}),
		"raw":                   rx(def, seedPkt{ctl: 7, raw: []byte("\x0a\x00\xff\xff\x00\x00\x00\x02\x80\x00\x00\x00garbage")}, seedPkt{ctl: 6, raw: []byte{0x11, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x1f, 0, 0, 0}}, seedPkt{ctl: 6, raw: make([]byte, 40)}),
		"wrong-source":          rx(def, seedPkt{ctl: 0x80, op: wire.OpWriteOnly, pm: plSmall(4), ext: cat(vaBase8(0, 0), lenPL())}),
		"bad-icrc":              rx(def, seedPkt{ctl: 0x10, op: wire.OpWriteOnly, pm: plSmall(4), ext: cat(vaBase8(0, 0), lenPL())}),
		"bad-pkey":              rx(def, seedPkt{ctl: 0x40, pkey: []byte{0x7F, 0xFF}, op: wire.OpWriteOnly, pm: plSmall(4), ext: cat(vaBase8(0, 0), lenPL())}),
		"unknown-qp":            rx(def, seedPkt{ctl: 0x20, destQP: []byte{0, 0, 1}, op: wire.OpWriteOnly, pm: plSmall(4), ext: cat(vaBase8(0, 0), lenPL())}),
		"pad-mismatch":          rx(def, seedPkt{op: wire.OpSendOnly, fl: 0x38, pm: plSmall(4)}, seedPkt{op: wire.OpWriteOnly, fl: 0x40, pm: plSmall(5), ext: cat(vaBase8(0, 0), lenPL())}),
		"tver-1":                rx(def, seedPkt{op: wire.OpSendOnly, fl: 0x80, pm: plSmall(4)}),
		"unknown-opcodes":       rx(def, seedPkt{op: 0x15, pm: plSmall(4)}, seedPkt{op: 0xC5}, seedPkt{op: 0x24, pm: plSmall(8)}),
	}
	write("FuzzReceivePath", rxSeeds)

	// FuzzRequesterResponses: header h0, h1, h2, SQ PSN. With MTU 256 and every work
	// request, the PSNs are: SEND 0, READ(600) 1-3 in requests 1-2 and 3, FETCH_ADD 4,
	// WRITE(300) 5-6, CMP_SWAP 7, READ(1000) 8-11 in requests 8-9 and 10-11, READ(0) 12,
	// WRITE_IMM(0) 13.
	th := func(h0, h1, h2 byte, psn wire.PSN) []byte {
		return []byte{h0, h1, h2, byte(psn >> 16), byte(psn >> 8), byte(psn)}
	}
	tx := func(hdr []byte, pkts ...seedPkt) []byte { return prog(fuzzRespOps, hdr, pkts...) }
	ack := func(d int) seedPkt { return seedPkt{op: wire.OpAcknowledge, psnd: psnDelta(d), ext: aethAck(0)} }
	nak := func(d int, syn byte) seedPkt {
		return seedPkt{op: wire.OpAcknowledge, psnd: psnDelta(d), ext: aethSyn(syn, 0)}
	}
	rr := func(op wire.Opcode, pm []byte) seedPkt {
		s := seedPkt{op: op, pm: pm, fill: 0x5A}
		if op != wire.OpReadResponseMiddle {
			s.ext = aethAck(0)
		}
		return s
	}
	aack := func(v byte) seedPkt { return seedPkt{op: wire.OpAtomicAcknowledge, ext: cat(aethAck(0), []byte{v})} }
	all := []seedPkt{
		ack(0),
		rr(wire.OpReadResponseFirst, plMTU()), rr(wire.OpReadResponseLast, plMTU()), rr(wire.OpReadResponseOnly, plBig(88)),
		aack(7), ack(1), aack(0),
		rr(wire.OpReadResponseFirst, plMTU()), rr(wire.OpReadResponseLast, plMTU()),
		rr(wire.OpReadResponseFirst, plMTU()), rr(wire.OpReadResponseLast, plBig(232)),
		rr(wire.OpReadResponseOnly, nil), ack(0),
	}
	tdef := th(0, 0, 0, 0)
	txSeeds := map[string][]byte{
		"empty":                 {},
		"header-only":           tdef,
		"all-complete":          tx(tdef, all...),
		"all-complete-psn-wrap": tx(th(0, 0, 0, 0xFFFFFA), all...),
		"all-no-flush": tx(tdef, func() []seedPkt {
			c := append([]seedPkt(nil), all...)
			for i := range c {
				c[i].ctl |= 0x08
			}
			return c
		}()...),
		"read-out-of-order":     tx(tdef, ack(0), rr(wire.OpReadResponseLast, plMTU()).withPSN(1), rr(wire.OpReadResponseFirst, plMTU())),
		"nak-seq":               tx(tdef, nak(1, wire.AETHNak|wire.NakPSNSeqError), ack(0)),
		"nak-seq-no-retries":    tx(th(0x1C, 0, 0, 0), nak(0, wire.AETHNak), nak(0, wire.AETHNak), nak(0, wire.AETHNak)),
		"nak-access":            tx(tdef, ack(0), nak(0, wire.AETHNak|wire.NakRemoteAccessError)),
		"nak-invalid":           tx(tdef, nak(0, wire.AETHNak|wire.NakInvalidRequest)),
		"nak-remote-op":         tx(tdef, nak(2, wire.AETHNak|wire.NakRemoteOpError)),
		"nak-invalid-rd":        tx(tdef, nak(1, wire.AETHNak|wire.NakInvalidRDRequest)),
		"nak-reserved":          tx(tdef, nak(0, wire.AETHNak|0x1F), nak(0, 0x40), nak(0, 0xE0)),
		"rnr":                   tx(tdef, nak(0, wire.AETHRNR|1), ack(0)),
		"rnr-no-retries":        tx(th(0xE0, 0, 0, 0), nak(0, wire.AETHRNR|1)),
		"read-wrong-length":     tx(tdef, ack(0), rr(wire.OpReadResponseFirst, plMTUPlus(5)), rr(wire.OpReadResponseFirst, plMTUPlus(-1))),
		"read-wrong-opcode":     tx(tdef, ack(0), rr(wire.OpReadResponseOnly, plMTU()), rr(wire.OpReadResponseMiddle, plMTU()), rr(wire.OpReadResponseLast, plBig(88)).withPSN(2)),
		"atomic-ack-for-read":   tx(tdef, ack(0), aack(1)),
		"read-resp-for-atomic":  tx(th(0, 0x04, 0, 0), rr(wire.OpReadResponseOnly, plSmall(8))),
		"ack-beyond-sent":       tx(tdef, ack(40)),
		"ack-covering-read":     tx(tdef, ack(5), ack(0)),
		"ack-duplicate":         tx(tdef, ack(0), ack(0), ack(-1), ack(-20)),
		"max-rd-atomic-1":       tx(th(0, 0, 0x0F, 0), ack(0), rr(wire.OpReadResponseFirst, plMTU()), rr(wire.OpReadResponseLast, plMTU()), rr(wire.OpReadResponseOnly, plBig(88)), aack(1)),
		"max-rd-atomic-0":       tx(th(0, 0, 0x10, 0), ack(0)),
		"fence":                 tx(th(0, 0, 0x20, 0), all...),
		"mtu-1024-reads":        tx(th(2, 0x22, 0, 0), rr(wire.OpReadResponseOnly, plBig(600)), rr(wire.OpReadResponseOnly, plBig(1000))),
		"mtu-512":               tx(th(1, 0, 0, 0), all...),
		"requests-to-requester": tx(tdef, seedPkt{op: wire.OpWriteOnly, pm: plSmall(8), ext: cat(vaBase8(0, 0), lenPL())}, seedPkt{op: wire.OpReadRequest, ext: cat(vaBase8(1, 0), len16(64))}, seedPkt{op: wire.OpSendOnly, pm: plSmall(8)}),
		"atomic-ack-raw-value":  tx(th(0, 0x04, 0, 0), seedPkt{op: wire.OpAtomicAcknowledge, ext: cat(aethAck(0), []byte{0xFF, 1, 2, 3, 4, 5, 6, 7, 8})}),
		"raw":                   tx(tdef, seedPkt{ctl: 7, raw: []byte("\x11\x00\xff\xff\x00\x00\x00\x00\x00\x00\x00\x00\x1f\x00\x00\x00xxxx")}, seedPkt{ctl: 6, raw: []byte{0x11, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x1f, 0, 0, 0}}),
		"wrong-source":          tx(tdef, seedPkt{ctl: 0x80, op: wire.OpAcknowledge, ext: aethAck(0)}),
		"bad-icrc":              tx(tdef, seedPkt{ctl: 0x10, op: wire.OpAcknowledge, ext: aethAck(0)}),
		"bad-pkey":              tx(tdef, seedPkt{ctl: 0x40, pkey: []byte{0, 1}, op: wire.OpAcknowledge, ext: aethAck(0)}),
		"unknown-qp":            tx(tdef, seedPkt{ctl: 0x20, destQP: []byte{0xFF, 0xFF, 0xFF}, op: wire.OpAcknowledge, ext: aethAck(0)}),
	}
	write("FuzzRequesterResponses", txSeeds)

	writeWeakSeeds(write)
}

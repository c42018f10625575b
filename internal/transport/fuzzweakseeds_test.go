package transport

import (
	"bytes"

	"github.com/softrnic/softrnic/internal/wire"
)

// weakSeedPkt is a weak-mode packet record in the form buildWeakPacket reads it. Its PSN
// is absolute.
type weakSeedPkt struct {
	ctl  byte
	op   wire.Opcode
	psn  wire.PSN
	pm   []byte // payload length field(s), for opcodes with a payload other than SACK ranges
	fill byte
	ext  []byte // standard extended-header fields, as buildPacket reads them
	ooh  []byte // OOH fields
	sack []byte // SACK fields
	raw  []byte // kinds 6 and 7
}

func (s weakSeedPkt) encode(ops []wire.Opcode) []byte {
	b := []byte{s.ctl}
	if s.ctl&7 >= 6 {
		return append(append(b, byte(len(s.raw))), s.raw...)
	}
	idx := -1
	for i, o := range ops {
		if o == s.op {
			idx = i
			break
		}
	}
	if idx < 0 || s.ctl&0x20 != 0 {
		b[0] |= 0x20
		b = append(b, byte(s.op))
	} else {
		b = append(b, byte(idx))
	}
	b = append(b, 0x80, byte(s.psn>>16), byte(s.psn>>8), byte(s.psn))
	if s.op.Info().Flags&wire.HasPayload != 0 && s.op != wire.OpWeakAck {
		pm := s.pm
		if pm == nil {
			pm = []byte{0}
		}
		b = append(append(b, pm...), s.fill)
	}
	return append(append(append(b, s.ext...), s.ooh...), s.sack...)
}

// OOH and SACK record encoders for seeds.
func oohOM(k, off, ln byte) byte { return k | off<<3 | ln<<5 }
func oohRec(seq, om byte, mid []byte, tx byte) []byte {
	return append(append([]byte{seq, om}, mid...), tx)
}

// sackRec is a SACK record with echo env.txSeq + int8(echo) and ranges [start, start+n).
func sackRec(echo int8, ranges ...[2]uint32) []byte {
	b := []byte{byte(len(ranges)), byte(echo)}
	for _, r := range ranges {
		b = append(b, 0x80, byte(r[0]>>16), byte(r[0]>>8), byte(r[0]), byte(r[1]))
	}
	return b
}

// writeWeakSeeds writes the seed corpora of FuzzWeakReceivePath and
// FuzzWeakRequesterResponses.
func writeWeakSeeds(save func(target string, seeds map[string][]byte)) {
	prog := func(ops []wire.Opcode, hdr []byte, pkts ...weakSeedPkt) []byte {
		b := append([]byte(nil), hdr...)
		for _, p := range pkts {
			b = append(b, p.encode(ops)...)
		}
		return b
	}
	// FuzzWeakReceivePath: header h0, h1, h2, RQ PSN. MTU 256 unless h0 says otherwise;
	// h2 0 is a max hole of 64.
	wh := func(h0, h1, h2 byte, psn wire.PSN) []byte {
		return []byte{h0, h1, h2, byte(psn >> 16), byte(psn >> 8), byte(psn)}
	}
	rx := func(hdr []byte, pkts ...weakSeedPkt) []byte { return prog(fuzzWeakReqOps, hdr, pkts...) }
	def := wh(0, 0, 0, 0)
	// A one-packet SEND of n (< 64) bytes with receive sequence number rsn.
	send := func(psn wire.PSN, rsn byte, n int) weakSeedPkt {
		return weakSeedPkt{op: wire.OpWeakSend, psn: psn, pm: plSmall(n), fill: 0x30 + rsn, ooh: oohRec(rsn, oohOM(0, 0, 0), nil, byte(psn))}
	}
	// Packet k of a SEND of 256+rest bytes at MTU 256: k 0 carries an MTU, k 1 the rest.
	send2 := func(psn wire.PSN, rsn byte, k int, rest int) weakSeedPkt {
		if k == 0 {
			return weakSeedPkt{op: wire.OpWeakSend, psn: psn, pm: plMTU(), fill: 0x50, ooh: oohRec(rsn, oohOM(0, 0, 1), []byte{byte(rest - 1)}, byte(psn))}
		}
		return weakSeedPkt{op: wire.OpWeakSend, psn: psn, pm: plSmall(rest), fill: 0x60, ooh: oohRec(rsn, oohOM(1, 0, 0), nil, byte(psn))}
	}
	write := func(psn wire.PSN, va []byte, n int) weakSeedPkt {
		return weakSeedPkt{op: wire.OpWeakWrite, psn: psn, pm: plSmall(n), fill: 0x11, ext: cat(va, lenPL()), ooh: oohRec(0, oohOM(0, 0, 0), nil, byte(psn))}
	}
	writeImm := func(psn wire.PSN, rsn byte, va []byte, n int, imm byte) weakSeedPkt {
		return weakSeedPkt{op: wire.OpWeakWriteImm, psn: psn, pm: plSmall(n), fill: 0x22, ext: cat(va, lenPL(), []byte{imm}), ooh: oohRec(rsn, oohOM(0, 0, 0), nil, byte(psn))}
	}
	read := func(psn wire.PSN, seq byte, va []byte, n int) weakSeedPkt {
		return weakSeedPkt{op: wire.OpWeakReadReq, psn: psn, ext: cat(va, len16(n)), ooh: oohRec(seq, oohOM(0, 3, 2), []byte{0, 0, byte(n >> 8), byte(n)}, byte(psn))}
	}
	fadd := func(psn wire.PSN, seq byte, va []byte, add byte) weakSeedPkt {
		return weakSeedPkt{op: wire.OpWeakFetchAdd, psn: psn, ext: cat(va, []byte{add, 0}), ooh: oohRec(seq, oohOM(0, 3, 3), nil, byte(psn))}
	}
	cswap := func(psn wire.PSN, seq byte, va []byte, swap, cmp byte) weakSeedPkt {
		return weakSeedPkt{op: wire.OpWeakCmpSwap, psn: psn, ext: cat(va, []byte{swap, cmp}), ooh: oohRec(seq, oohOM(0, 3, 3), nil, byte(psn))}
	}
	with := func(p weakSeedPkt, f func(*weakSeedPkt)) weakSeedPkt { f(&p); return p }
	rxSeeds := map[string][]byte{
		"empty":                 {},
		"header-only":           def,
		"send-in-order":         rx(def, send(0, 0, 20), send(1, 1, 30), send(2, 2, 0)),
		"send-beyond-hole":      rx(def, send(0, 0, 20), send(2, 2, 21), send(1, 1, 22)),
		"send-two-holes":        rx(def, send(0, 0, 1), send(2, 2, 2), send(4, 4&3, 3), send(3, 3, 4), send(1, 1, 5)),
		"send-multi-reversed":   rx(def, send2(1, 0, 1, 44), send2(0, 0, 0, 44), send(2, 1, 7)),
		"send-too-long":         rx(def, send2(0, 0, 0, 194), send2(1, 0, 1, 194)),
		"send-two-sges":         rx(wh(0, 0x40, 0, 0), send2(1, 0, 1, 44), send2(0, 0, 0, 44)),
		"send-bad-recv-lkey":    rx(wh(0, 0x20, 0, 0), send(1, 1, 3), send(0, 0, 3)),
		"send-imm":              rx(def, weakSeedPkt{op: wire.OpWeakSendImm, psn: 0, pm: plSmall(9), fill: 1, ext: []byte{0x77}, ooh: oohRec(0, oohOM(0, 0, 0), nil, 0)}),
		"rnr":                   rx(wh(0xC0, 0, 0, 0), send(0, 0, 5), send(1, 1, 5), write(2, vaBase8(0, 0), 4)),
		"rnr-beyond-wqes":       rx(wh(0x80, 0, 0, 0), send(2, 2, 5), send(0, 0, 5), send(1, 1, 5)),
		"write-beyond-hole":     rx(def, write(1, vaBase8(0, 4), 16), write(0, vaBase8(0, 0), 32)),
		"write-multi-reversed":  rx(def, with(write(1, vaOff(0, 256), 40), func(p *weakSeedPkt) { p.ooh = oohRec(0, oohOM(1, 0, 0), nil, 1) }), with(write(0, vaBase8(0, 0), 0), func(p *weakSeedPkt) { p.pm, p.ooh = plMTU(), oohRec(0, oohOM(0, 0, 1), []byte{39}, 0) })),
		"write-imm-beyond-hole": rx(def, writeImm(1, 0, vaBase8(0, 2), 8, 0x42), write(0, vaBase8(0, 0), 8)),
		"write-imm-no-wqe":      rx(wh(0xC0, 0, 0, 0), writeImm(0, 0, vaBase8(0, 2), 8, 1)),
		"write-other-pd":        rx(def, write(1, vaBase8(0, 0), 4), write(0, vaBase8(2, 1), 16)),
		"write-read-only-mr":    rx(def, write(0, vaBase8(1, 0), 16)),
		"write-past-end":        rx(def, write(0, vaEnd(0, 16), 32)),
		"write-zero-length":     rx(def, weakSeedPkt{op: wire.OpWeakWrite, psn: 0, ext: cat(vaRaw(0, 0xdeadbeef00), lenPL()), ooh: oohRec(0, oohOM(0, 0, 0), nil, 0)}),
		"read-held":             rx(def, read(1, 0, vaBase8(0, 0), 300), write(0, vaBase8(0, 40), 8)),
		"read-rerequest":        rx(def, read(0, 0, vaBase8(0, 0), 600), read(1, 0, vaOff(0, 256), 344), read(0, 0, vaBase8(0, 0), 600)),
		"read-ring-overflow":    rx(wh(0, 0x0F, 0, 0), read(1, 0, vaBase8(0, 0), 100), read(2, 1, vaBase8(0, 1), 100), write(0, vaBase8(0, 2), 4)),
		"read-read-only-mr":     rx(def, read(0, 0, vaBase8(1, 0), 300)),
		"read-zero":             rx(def, read(0, 0, vaRaw(0, 1), 0)),
		"read-max-dest-0":       rx(wh(0, 0x10, 0, 0), read(0, 0, vaBase8(0, 0), 64)),
		"atomics-held":          rx(def, fadd(1, 0, vaBase8(0, 1), 5), cswap(2, 1, vaBase8(0, 1), 0x7F, 5), write(0, vaBase8(0, 8), 4), fadd(1, 0, vaBase8(0, 1), 5), fadd(3, 2, vaBase8(0, 1), 1)),
		"atomic-misaligned":     rx(def, fadd(0, 0, []byte{0x48, 1}, 1)),
		"atomic-past-end":       rx(def, fadd(0, 0, vaEnd(0, 4), 1)),
		"beyond-span":           rx(def, send(0, 0, 3), send(64, 1, 3), send(63, 1, 3), send(65, 2, 3)),
		"beyond-span-256":       rx(wh(0, 0, 2, 0), send(200, 1, 3), send(0, 0, 3)),
		"offset-misaligned":     rx(def, with(send(0, 0, 10), func(p *weakSeedPkt) { p.ooh = oohRec(0, oohOM(0, 1, 0), nil, 0) })),
		"length-mismatch":       rx(def, with(send(0, 0, 10), func(p *weakSeedPkt) { p.ooh = oohRec(0, oohOM(0, 0, 2), []byte{0, 0, 1, 0}, 0) })),
		"offset-past-length":    rx(def, with(send(0, 0, 10), func(p *weakSeedPkt) { p.ooh = oohRec(0, oohOM(2, 0, 3), nil, 0) })),
		"ooh-reserved-flags":    rx(def, with(send(0, 0, 10), func(p *weakSeedPkt) { p.ooh = oohRec(0, 0x80|oohOM(0, 0, 0), []byte{0x82}, 0) })),
		"write-with-recv-flag":  rx(def, with(write(0, vaBase8(0, 0), 8), func(p *weakSeedPkt) { p.ooh = oohRec(0, 0x80|oohOM(0, 0, 0), []byte{wire.OOHRecv}, 0) })),
		"send-seq-far": rx(def, with(send(0, 0, 10), func(p *weakSeedPkt) {
			p.ooh = oohRec(0x80, oohOM(0, 0, 0), nil, 0)
			p.ooh = append([]byte{0x80, 0x12, 0x34, 0x56}, p.ooh[1:]...)
		})),
		"duplicates": rx(def, send(0, 0, 4), send(0, 0, 4), write(1, vaBase8(0, 0), 8), write(1, vaBase8(0, 0), 8), send(3, 2, 4), send(3, 2, 4), send(2, 1, 4)),
		"tx-seq-max": rx(def, with(send(0, 0, 4), func(p *weakSeedPkt) {
			p.ooh = oohRec(0, oohOM(0, 0, 0), nil, 0xFF)
			p.ooh = append(p.ooh, 0xFF, 0xFF, 0xFF, 0xF0)
		})),
		"ordered-opcode":    rx(def, send(0, 0, 4), weakSeedPkt{op: wire.OpSendOnly, psn: 1, pm: plSmall(4)}),
		"ack-to-responder":  rx(def, weakSeedPkt{op: wire.OpWeakAck, psn: 0, ext: aethAck(0), sack: sackRec(0, [2]uint32{2, 3})}),
		"psn-wrap":          rx(wh(0, 0, 0, 0xFFFFFE), send(0xFFFFFE, 0, 4), send(0, 2, 4), send(0xFFFFFF, 1, 4), read(1, 0, vaBase8(0, 0), 512)),
		"rtr":               rx(wh(0x20, 0, 0, 0), send(1, 1, 3), write(0, vaBase8(0, 0), 16), send(2, 0, 3)),
		"qp-without-rights": rx(wh(0x1C, 0, 0, 0), write(0, vaBase8(0, 0), 16), read(1, 0, vaBase8(0, 0), 16), fadd(2, 0, vaBase8(0, 0), 1)),
		"srq":               rx(wh(0, 0x80, 0, 0), send(1, 1, 20), send(0, 0, 20), send(2, 2, 8)),
		"mtu-1024":          rx(wh(2, 0, 0, 0), send(1, 1, 40), with(send(0, 0, 0), func(p *weakSeedPkt) { p.pm = plMTU(); p.ooh = oohRec(0, oohOM(0, 0, 1), []byte{0}, 0) })),
		"no-flush-batch":    rx(def, with(send(1, 1, 4), func(p *weakSeedPkt) { p.ctl = 0x08 }), with(read(2, 0, vaBase8(0, 0), 300), func(p *weakSeedPkt) { p.ctl = 0x08 }), with(fadd(4, 1, vaBase8(0, 0), 1), func(p *weakSeedPkt) { p.ctl = 0x08 }), send(0, 0, 4)),
		"wrong-source":      rx(def, with(send(0, 0, 4), func(p *weakSeedPkt) { p.ctl = 0x80 })),
		"bad-icrc":          rx(def, with(send(0, 0, 4), func(p *weakSeedPkt) { p.ctl = 0x10 })),
		"no-ackreq":         rx(def, with(send(1, 1, 4), func(p *weakSeedPkt) { p.ctl = 0x40 }), with(send(0, 0, 4), func(p *weakSeedPkt) { p.ctl = 0x40 })),
		"raw":               rx(def, weakSeedPkt{ctl: 7, raw: []byte("\xc2\x00\xff\xff\x00\x00\x00\x02\x80\x00\x00\x00garbage")}, weakSeedPkt{ctl: 6, raw: make([]byte, 40)}, weakSeedPkt{ctl: 6, raw: append([]byte{0xC6, 0, 0, 0, 0, 0, 0, 0, 0x80, 0, 0, 0}, make([]byte, 36)...)}),
	}
	save("FuzzWeakReceivePath", rxSeeds)

	// FuzzWeakRequesterResponses: header h0, h1, h2, SQ PSN. With MTU 256, every work
	// request and ReadChunk 2, the PSNs are: SEND 0, READ(600) 1-3, FETCH_ADD 4, WRITE(300)
	// 5-6, CMP_SWAP 7, READ(1000) 8-11, READ(0) 12, WRITE_IMM(0) 13. h2 0 is a max hole
	// of 64.
	th := func(h0, h1, h2 byte, psn wire.PSN) []byte {
		return []byte{h0, h1, h2, byte(psn >> 16), byte(psn >> 8), byte(psn)}
	}
	tx := func(hdr []byte, pkts ...weakSeedPkt) []byte { return prog(fuzzWeakRespOps, hdr, pkts...) }
	// A SACK of everything up to base+upTo (upTo -1: nothing new) and ranges relative to base.
	sack := func(base wire.PSN, upTo int, echo int8, syn []byte, ranges ...[2]uint32) weakSeedPkt {
		for i := range ranges {
			ranges[i][0] = uint32(base.Add(ranges[i][0]))
		}
		ext := aethAck(0)
		if syn != nil {
			ext = syn
		}
		return weakSeedPkt{op: wire.OpWeakAck, psn: base.Add(uint32(upTo) & wire.PSNMask), ext: ext, sack: sackRec(echo, ranges...)}
	}
	rr := func(base wire.PSN, k uint32, pm []byte) weakSeedPkt {
		return weakSeedPkt{op: wire.OpReadResponseOnly, psn: base.Add(k), pm: pm, fill: 0x5A, ext: aethAck(0)}
	}
	aack := func(base wire.PSN, k uint32, v byte) weakSeedPkt {
		return weakSeedPkt{op: wire.OpAtomicAcknowledge, psn: base.Add(k), ext: cat(aethAck(0), []byte{v})}
	}
	inOrder := func(base wire.PSN) []weakSeedPkt {
		return []weakSeedPkt{
			sack(base, 0, -100, nil),
			rr(base, 1, plMTU()), rr(base, 2, plMTU()), rr(base, 3, plBig(88)),
			aack(base, 4, 7), sack(base, 6, -100, nil), aack(base, 7, 0),
			rr(base, 8, plMTU()), rr(base, 9, plMTU()), rr(base, 10, plMTU()), rr(base, 11, plBig(232)),
			rr(base, 12, nil), sack(base, 13, -100, nil),
		}
	}
	reversed := func(base wire.PSN) []weakSeedPkt {
		return []weakSeedPkt{
			sack(base, -1, -100, nil, [2]uint32{13, 1}, [2]uint32{5, 2}),
			rr(base, 12, nil), rr(base, 11, plBig(232)), rr(base, 10, plMTU()), rr(base, 9, plMTU()), rr(base, 8, plMTU()),
			aack(base, 7, 0), aack(base, 4, 7),
			rr(base, 3, plBig(88)), rr(base, 2, plMTU()), rr(base, 1, plMTU()),
			sack(base, 0, -100, nil),
		}
	}
	nak := func(code byte) []byte { return aethSyn(wire.AETHNak|code, 0) }
	tdef := th(0, 0, 0, 0)
	noFlush := func(ps []weakSeedPkt) []weakSeedPkt {
		c := append([]weakSeedPkt(nil), ps...)
		for i := range c {
			c[i].ctl |= 0x08
		}
		return c
	}
	txSeeds := map[string][]byte{
		"empty":                  {},
		"header-only":            tdef,
		"all-in-order":           tx(tdef, inOrder(0)...),
		"all-reversed":           tx(tdef, reversed(0)...),
		"all-in-order-psn-wrap":  tx(th(0, 0, 0, 0xFFFFFA), inOrder(0xFFFFFA)...),
		"all-reversed-psn-wrap":  tx(th(0, 0, 0, 0xFFFFFD), reversed(0xFFFFFD)...),
		"all-no-flush":           tx(tdef, noFlush(reversed(0))...),
		"all-default-max-hole":   tx(th(0, 0, 0xC0, 0), reversed(0)...),
		"sack-ranges":            tx(tdef, sack(0, -1, -100, nil, [2]uint32{5, 2}, [2]uint32{13, 1}), sack(0, 0, -100, nil), sack(0, 13, -100, nil)),
		"sack-echo-loss":         tx(tdef, sack(0, -1, 0, nil, [2]uint32{13, 1}), sack(0, -1, 0, nil, [2]uint32{6, 1}), rr(0, 12, nil)),
		"sack-echo-then-all":     tx(tdef, append([]weakSeedPkt{sack(0, -1, 0, nil, [2]uint32{13, 1})}, inOrder(0)...)...),
		"sack-echo-future":       tx(tdef, with(sack(0, 0, 0, nil), func(p *weakSeedPkt) { p.sack = []byte{0x80, 0x7F, 0xFF, 0xFF, 0xFF} })),
		"sack-too-many-ranges":   tx(tdef, with(sack(0, 0, 0, nil), func(p *weakSeedPkt) { p.sack = append([]byte{17, 0}, bytes.Repeat([]byte{5, 1}, 17)...) })),
		"sack-payload-short":     tx(tdef, with(sack(0, 0, 0, nil, [2]uint32{5, 1}), func(p *weakSeedPkt) { p.sack[0] |= 0x40 })),
		"sack-count-raw":         tx(tdef, with(sack(0, 0, 0, nil), func(p *weakSeedPkt) { p.sack = []byte{0x20, 0, 0, 0, 1, 0} })),
		"sack-empty-range":       tx(tdef, sack(0, 0, 0, nil, [2]uint32{5, 0})),
		"sack-beyond-sent":       tx(tdef, sack(0, -1, 0, nil, [2]uint32{10, 30}), sack(0, 40, 0, nil), sack(0, 13, 0, nil)),
		"sack-covering-reads":    tx(tdef, sack(0, 13, 0, nil, [2]uint32{1, 12})),
		"sack-duplicate":         tx(tdef, sack(0, 0, -100, nil), sack(0, 0, -100, nil), sack(0, -1, -100, nil), sack(0, -20, -100, nil)),
		"rnr":                    tx(tdef, sack(0, -1, -100, aethSyn(wire.AETHRNR|1, 0)), sack(0, 0, -100, nil)),
		"rnr-with-ranges":        tx(tdef, sack(0, 0, 0, aethSyn(wire.AETHRNR|1, 0), [2]uint32{5, 2})),
		"rnr-no-retries":         tx(th(0xE0, 0, 0, 0), sack(0, -1, -100, aethSyn(wire.AETHRNR|1, 0)), sack(0, -1, -100, aethSyn(wire.AETHRNR|1, 0))),
		"nak-access":             tx(tdef, sack(0, 0, -100, nil), sack(0, 0, -100, nak(wire.NakRemoteAccessError))),
		"nak-invalid":            tx(tdef, sack(0, -1, -100, nak(wire.NakInvalidRequest))),
		"nak-remote-op":          tx(tdef, sack(0, 2, -100, nak(wire.NakRemoteOpError))),
		"nak-invalid-rd":         tx(tdef, sack(0, 1, -100, nak(wire.NakInvalidRDRequest))),
		"nak-seq":                tx(tdef, sack(0, 1, -100, nak(wire.NakPSNSeqError))),
		"nak-reserved":           tx(tdef, sack(0, -1, -100, aethSyn(0x40, 0)), sack(0, -1, -100, aethSyn(0xE0, 0))),
		"ordered-ack":            tx(tdef, weakSeedPkt{op: wire.OpAcknowledge, psn: 0, ext: aethAck(0)}),
		"read-wrong-length":      tx(tdef, rr(0, 1, plMTUPlus(5)), rr(0, 3, plMTU()), rr(0, 12, plSmall(1))),
		"read-response-for-send": tx(tdef, rr(0, 0, plSmall(8)), rr(0, 5, plMTU())),
		"atomic-ack-for-read":    tx(tdef, aack(0, 1, 1), aack(0, 0, 1)),
		"duplicate-responses":    tx(tdef, rr(0, 1, plMTU()), rr(0, 1, plMTU()), aack(0, 4, 1), aack(0, 4, 2), rr(0, 2, plMTU()), rr(0, 3, plBig(88)), rr(0, 3, plBig(88))),
		"max-rd-atomic-1":        tx(th(0, 0, 0x0F, 0), sack(0, 0, -100, nil), rr(0, 1, plMTU()), rr(0, 2, plMTU()), rr(0, 3, plBig(88)), aack(0, 4, 1)),
		"max-rd-atomic-0":        tx(th(0, 0, 0x10, 0), sack(0, 0, -100, nil)),
		"fence":                  tx(th(0, 0, 0x20, 0), reversed(0)...),
		"mtu-1024":               tx(th(2, 0, 0, 0), sack(0, 0, -100, nil), rr(0, 1, plBig(600)), aack(0, 2, 1)),
		"mtu-512":                tx(th(1, 0, 0, 0), reversed(0)...),
		"some-wrs":               tx(th(0, 0x25, 0, 0), sack(0, -1, 0, nil, [2]uint32{2, 1}), rr(0, 1, plMTU())),
		"requests-to-requester":  tx(tdef, weakSeedPkt{op: wire.OpWeakSend, psn: 0, pm: plSmall(8), ooh: oohRec(0, oohOM(0, 0, 0), nil, 0)}),
		"wrong-source":           tx(tdef, with(sack(0, 13, 0, nil), func(p *weakSeedPkt) { p.ctl = 0x80 })),
		"bad-icrc":               tx(tdef, with(sack(0, 13, 0, nil), func(p *weakSeedPkt) { p.ctl = 0x10 })),
		"raw":                    tx(tdef, weakSeedPkt{ctl: 7, raw: []byte("\xc1\x00\xff\xff\x00\x00\x00\x00\x00\x00\x00\x00\x1f\x00\x00\x00xxxx")}, weakSeedPkt{ctl: 6, raw: append([]byte{0xC1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x1f, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 9}, 0, 0, 0, 5, 0, 0, 0, 6)}),
	}
	save("FuzzWeakRequesterResponses", txSeeds)
}

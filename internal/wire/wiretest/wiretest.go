// Package wiretest builds RoCEv2 packets and fuzz corpus files for the tests of wire and
// of the packages above it (transport). It is imported by tests only.
package wiretest

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/softrnic/softrnic/internal/wire"
)

// Flow is the ICRC flow of packets from src to dst as softrnic sends them (DF set, IP ID
// 0).
func Flow(src, dst netip.AddrPort) wire.Flow {
	return wire.Flow{Src: src.Addr(), Dst: dst.Addr(), SrcPort: src.Port(), DstPort: dst.Port(), DF: true}
}

// AppendICRC appends the ICRC of pkt (BTH to the end of the pad) for flow fl.
func AppendICRC(fl *wire.Flow, pkt []byte) []byte {
	var c [wire.ICRCLen]byte
	wire.PutICRC(c[:], fl.ICRC(pkt))
	return append(pkt, c[:]...)
}

// Seal finishes pkt, a packet from its BTH (PadCnt 0) to the end of its payload: it
// appends the pad the payload needs, sets the BTH's PadCnt and appends the ICRC for fl.
// The header length is the one of pkt's opcode.
func Seal(fl *wire.Flow, pkt []byte) []byte {
	pad := wire.PadFor(len(pkt) - wire.Opcode(pkt[0]).Info().HdrLen)
	pkt = append(pkt, make([]byte, pad)...)
	pkt[1] |= byte(pad) << 4
	return AppendICRC(fl, pkt)
}

// Build makes a sealed packet: the headers of bth's opcode with bth (its PadCnt 0) in
// front, fill writes the extended headers into them, then payload, pad and ICRC for fl.
func Build(fl *wire.Flow, bth wire.BTH, fill func(hdr []byte), payload []byte) []byte {
	info := bth.Opcode.Info()
	pkt := make([]byte, info.HdrLen, info.HdrLen+len(payload)+wire.PadFor(len(payload))+wire.ICRCLen)
	bth.Put(pkt)
	if fill != nil {
		fill(pkt)
	}
	return Seal(fl, append(pkt, payload...))
}

// PutOOH writes o as the last extended header of hdr (where every weak-mode opcode but
// the SACK carries it).
func PutOOH(hdr []byte, o wire.OOH) { o.Put(hdr[len(hdr)-wire.OOHLen:]) }

// CorpusFile encodes fuzz arguments in the "go test fuzz v1" format.
func CorpusFile(args ...any) []byte {
	var b bytes.Buffer
	b.WriteString("go test fuzz v1\n")
	for _, a := range args {
		switch v := a.(type) {
		case []byte:
			fmt.Fprintf(&b, "[]byte(%q)\n", v)
		case string:
			fmt.Fprintf(&b, "string(%q)\n", v)
		case bool, uint16, uint32, uint64, uint8, int:
			fmt.Fprintf(&b, "%T(%v)\n", v, v)
		default:
			panic(errors.New("CorpusFile: unsupported type " + fmt.Sprintf("%T", a)))
		}
	}
	return b.Bytes()
}

// ClearSeeds removes the generated seeds of a corpus directory, keeping the inputs the
// fuzzer found (named regression-*), which a generator cannot make again.
func ClearSeeds(dir string) error {
	ents, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "regression-") {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

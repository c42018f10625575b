package rsocket

import (
	"bytes"
	"encoding/hex"
	"errors"
	"testing"
)

// TestConnDataLayout checks the connect block byte for byte against librdmacm's layout:
// version, flags, big-endian credits, three reserved bytes, the iomap scale, then the
// target area and the first grant as big-endian address, key and length.
func TestConnDataLayout(t *testing.T) {
	d := connData{Version: 1, Flags: flagIOMap, Credits: 384, IOMap: 0,
		Target:  sge{Addr: 0x0102030405060708, Key: 0x11223344, Len: 2},
		DataBuf: sge{Addr: 0x1112131415161718, Key: 0x55667788, Len: 0x10000}}
	b := make([]byte, connDataLen)
	d.put(b)
	want, _ := hex.DecodeString("0102" + "0180" + "000000" + "00" +
		"0102030405060708" + "11223344" + "00000002" +
		"1112131415161718" + "55667788" + "00010000")
	if !bytes.Equal(b, want) {
		t.Fatalf("connect block\n got %x\nwant %x", b, want)
	}
	got, err := parseConnData(b)
	if err != nil || got != d {
		t.Fatalf("parse = %+v, %v; want %+v", got, err, d)
	}
}

// TestConnDataRefused checks what a peer's connect block must satisfy.
func TestConnDataRefused(t *testing.T) {
	good := connData{Version: 1, Credits: 16, Target: sge{Len: 2}, DataBuf: sge{Len: 4096}}
	for _, tc := range []struct {
		name string
		edit func(*connData)
		n    int
	}{
		{"short", nil, connDataLen - 1},
		{"version 2", func(d *connData) { d.Version = 2 }, connDataLen},
		{"one grant slot", func(d *connData) { d.Target.Len = 1 }, connDataLen},
		{"empty first grant", func(d *connData) { d.DataBuf.Len = 0 }, connDataLen},
		{"no credits", func(d *connData) { d.Credits = 0 }, connDataLen},
	} {
		d := good
		if tc.edit != nil {
			tc.edit(&d)
		}
		b := make([]byte, connDataLen)
		d.put(b)
		if _, err := parseConnData(b[:tc.n]); !errors.Is(err, errConnData) {
			t.Errorf("%s: %v, want errConnData", tc.name, err)
		}
	}
	b := make([]byte, 56) // what the connection manager hands over: zero-padded
	good.put(b)
	if _, err := parseConnData(b); err != nil {
		t.Errorf("a block with padding after it: %v", err)
	}
}

// TestScale checks the one-byte iomap size: literal up to 128, units of 256 above.
func TestScale(t *testing.T) {
	for _, tc := range []struct {
		v    int
		b    uint8
		back int
	}{{0, 0, 0}, {1, 1, 1}, {128, 0x80, 128}, {256, 0x81, 256}, {1000, 0x83, 768}, {1 << 20, 0xFF, 0x7F00}} {
		if b := scaleOf(tc.v); b != tc.b || valueOfScale(b) != tc.back {
			t.Errorf("scaleOf(%d) = %#x -> %d; want %#x -> %d", tc.v, b, valueOfScale(b), tc.b, tc.back)
		}
	}
}

// TestImm checks the immediate's split: 3 bits of operation, 29 of value.
func TestImm(t *testing.T) {
	if v := imm(opCtrl, ctrlShutdown); v != 0xE0000002 {
		t.Errorf("SHUTDOWN = %#x, want 0xe0000002", v)
	}
	if v := imm(opSGL, 384); v != 0x80000180 {
		t.Errorf("credits 384 = %#x, want 0x80000180", v)
	}
	if op, v := immOp(0x1FFFFFFF); op != opData || v != 1<<29-1 {
		t.Errorf("immOp(0x1fffffff) = %d, %d", op, v)
	}
}

// TestSGEByteOrder checks grants in the reader's order: little-endian unless it said
// otherwise.
func TestSGEByteOrder(t *testing.T) {
	s := sge{Addr: 0x0102030405060708, Key: 0x0A0B0C0D, Len: 0x8000}
	b := make([]byte, sgeLen)
	putSGE(b, s, false)
	if want, _ := hex.DecodeString("08070605040302010d0c0b0a00800000"); !bytes.Equal(b, want) {
		t.Errorf("little-endian grant %x", b)
	}
	if getSGE(b) != s {
		t.Errorf("getSGE = %+v", getSGE(b))
	}
	putSGE(b, s, true)
	if want, _ := hex.DecodeString("01020304050607080a0b0c0d00008000"); !bytes.Equal(b, want) {
		t.Errorf("big-endian grant %x", b)
	}
}

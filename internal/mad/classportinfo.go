package mad

import "encoding/binary"

// ClassPortInfo (attribute 0x0001) is the one CM attribute answered to a Get: softrnic's
// connection manager sends it to a peer's QP1 as a keep-alive probe, and a CM that is
// alive answers with GetResp.

// PutClassPortInfoGet encodes a Get of ClassPortInfo with transaction ID tid into b.
func PutClassPortInfoGet(b []byte, tid uint64) {
	_ = b[Size-1]
	clear(b[:Size])
	h := Header{BaseVersion: BaseVersion, MgmtClass: ClassCM, ClassVersion: ClassVersion, Method: MethodGet, TID: tid, AttrID: AttrClassPortInfo}
	h.Put(b)
}

// PutClassPortInfoResp encodes the GetResp to a Get of ClassPortInfo with transaction ID
// tid into b: base and class version, no capabilities, the response time value resp
// (5 bits: 4.096 µs × 2^resp).
func PutClassPortInfoResp(b []byte, tid uint64, resp uint8) {
	_ = b[Size-1]
	clear(b[:Size])
	h := Header{BaseVersion: BaseVersion, MgmtClass: ClassCM, ClassVersion: ClassVersion, Method: MethodGetResp, TID: tid, AttrID: AttrClassPortInfo}
	h.Put(b)
	d := b[HeaderLen:]
	d[0], d[1] = BaseVersion, ClassVersion
	setBits(&d[7], 3, 5, resp)
}

// A softrnic device's incarnation travels in a ClassPortInfo MAD after the attribute's 72
// bytes, in what IBTA leaves reserved (a Get's data is not read, a GetResp's tail is
// padding): a mark, then the 64-bit value. The incarnation is a random number drawn when
// the device opens, so a new device at the address of a vanished one is told apart from it.
const (
	classPortInfoLen    = 72
	incarnationOff      = HeaderLen + classPortInfoLen
	incarnationMarkWord = 0x53524E43 // "SRNC"
)

// PutIncarnation adds the incarnation inc (not 0) to the ClassPortInfo Get or GetResp
// encoded in b.
func PutIncarnation(b []byte, inc uint64) {
	_ = b[Size-1]
	binary.BigEndian.PutUint32(b[incarnationOff:], incarnationMarkWord)
	binary.BigEndian.PutUint64(b[incarnationOff+4:], inc)
}

// Incarnation returns the incarnation a ClassPortInfo MAD carries, and false if it carries
// none (a standard CM's, or an older softrnic's).
func Incarnation(b []byte) (uint64, bool) {
	if len(b) != Size || binary.BigEndian.Uint32(b[incarnationOff:]) != incarnationMarkWord {
		return 0, false
	}
	inc := binary.BigEndian.Uint64(b[incarnationOff+4:])
	return inc, inc != 0
}

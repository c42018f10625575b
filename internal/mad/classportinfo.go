package mad

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

package verbs_test

import (
	"testing"

	"github.com/softrnic/softrnic/internal/mad"
	"github.com/softrnic/softrnic/internal/verbstest"
	"github.com/softrnic/softrnic/verbs"
)

// Every device answers CM MADs on QP1: a ConnectRequest for a service nobody listens on
// is rejected with "invalid service ID", a service ID resolution answered "not
// supported", to the sender's QP and (a softrnic sender's) port, with the request's
// transaction and communication or request IDs; a MAD that is neither gets no answer.
func TestQP1RejectsWithoutListener(t *testing.T) {
	r := newUDRig(t)
	qp := verbstest.NewUDQP(t, r.pd[0], r.cq[0], mad.GSIQKey)
	buf := verbstest.MustReg(t, r.pd[0], make([]byte, 4096), verbs.AccessLocalWrite)
	verbstest.MustPostRecv(t, qp, verbs.RecvWR{WRID: 1, SGList: verbstest.SGL(buf, 0, 2048)})
	ah := r.ah(t, 0, 1)
	// The send's completion and the answer's come on the same CQ, in either order.
	var answer *verbs.WorkCompletion
	send := func(m mad.Message, tid uint64, answered bool) {
		t.Helper()
		mad.Put(buf.Buf()[2048:2048+mad.Size], tid, m)
		verbstest.MustPostSend(t, qp, verbs.SendWR{WRID: tid, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled,
			SGList: verbstest.SGL(buf, 2048, mad.Size), AH: ah, RemoteQPN: 1, RemoteQKey: mad.GSIQKey})
		n := 1
		if answered {
			n = 2
		}
		for _, wc := range verbstest.PollN(t, r.cq[0], n) {
			if wc.Opcode == verbs.WCSend {
				verbstest.WantSendWC(t, wc, tid, verbs.WCSend, qp)
			} else {
				answer = &wc
			}
		}
	}
	// An RTU first: no answer. Then a REQ: a REJ.
	send(&mad.RTU{LocalCommID: 5, RemoteCommID: 6}, 0x1, false)
	send(&mad.REQ{LocalCommID: 0xC0FFEE, ServiceID: mad.ServiceID(7471), LocalQPN: qp.QPNum(), LocalEECN: mad.SoftrnicEECNMark}, 0x77, true)
	if answer == nil {
		t.Fatal("no answer to the REQ")
	}
	wc := *answer
	if wc.Status != verbs.WCSuccess || wc.WRID != 1 || wc.SrcQP != 1 || wc.ByteLen != verbs.GRHLen+mad.Size {
		t.Fatalf("answer: %+v", wc)
	}
	var rej mad.REJ
	h, err := mad.Decode(buf.Buf()[verbs.GRHLen:verbs.GRHLen+mad.Size], &rej)
	if err != nil || h.TID != 0x77 || rej.RemoteCommID != 0xC0FFEE || rej.Reason != mad.RejInvalidServiceID || rej.MessageRejected != mad.MsgREQ {
		t.Fatalf("answer %+v %+v (%v), want a REJ of the REQ for an invalid service ID", h, rej, err)
	}
	answer = nil
	verbstest.MustPostRecv(t, qp, verbs.RecvWR{WRID: 2, SGList: verbstest.SGL(buf, 0, 2048)})
	send(&mad.SIDRREQ{RequestID: 0xD00D, PKey: 0xFFFF, Reserved: mad.SoftrnicSIDRMark, ServiceID: mad.UDPServiceID(7174)}, 0x78, true)
	if answer == nil {
		t.Fatal("no answer to the SIDR_REQ")
	}
	var rep mad.SIDRREP
	h, err = mad.Decode(buf.Buf()[verbs.GRHLen:verbs.GRHLen+mad.Size], &rep)
	if err != nil || h.TID != 0x78 || rep.RequestID != 0xD00D || rep.Status != mad.SIDRUnsupported || rep.ServiceID != mad.UDPServiceID(7174) {
		t.Fatalf("answer %+v %+v (%v), want a SIDR_REP of the request: not supported", h, rep, err)
	}
	verbstest.ExpectEmpty(t, r.cq[0], "a second answer")
}

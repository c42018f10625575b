package transport

// ordered is standard RC as IBTA specifies it: the responder places packets in PSN order
// and sequence-NAKs a gap; the requester goes back to the first unacknowledged PSN on a
// NAK, a timeout or the end of an RNR wait (go-back-N). Its three roles' own parts are
// small: the requester's record of where it went back to (orderedRequester), the
// completer's last sequence NAK (orderedCompleter), and the responder's message in
// progress (orderedResponder). The QP holds one (QP.ord), started afresh each time the QP
// becomes ordered (setOrdering).
type ordered struct {
	req  orderedRequester
	comp orderedCompleter
	resp orderedResponder
}

func (o *ordered) init(q *QP) {
	*o = ordered{
		req:  orderedRequester{r: &q.req},
		comp: orderedCompleter{q: q, c: &q.comp},
		resp: orderedResponder{q: q, rs: &q.resp},
	}
	o.comp.req = &o.req
}

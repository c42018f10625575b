package verbstest

import (
	"testing"

	"github.com/softrnic/softrnic/verbs"
)

// NewUDQP creates a UD QP on pd with cq for both queues and brings it to RTS with Q_Key
// qkey, as ibv_modify_qp requires for UD: RESET->INIT (P_Key index, port, Q_Key),
// INIT->RTR, RTR->RTS (sq_psn).
func NewUDQP(t testing.TB, pd *verbs.PD, cq *verbs.CQ, qkey uint32) *verbs.QP {
	t.Helper()
	qp, err := pd.CreateQP(&verbs.QPInitAttr{QPType: verbs.QPTypeUD, SendCQ: cq, RecvCQ: cq, Cap: DefaultCap})
	if err != nil {
		t.Fatalf("CreateQP(UD): %v", err)
	}
	steps := []struct {
		attr verbs.QPAttr
		mask verbs.QPAttrMask
	}{
		{verbs.QPAttr{QPState: verbs.StateInit, PortNum: 1, QKey: qkey}, verbs.QPAttrState | verbs.QPAttrPKeyIndex | verbs.QPAttrPort | verbs.QPAttrQKey},
		{verbs.QPAttr{QPState: verbs.StateRTR}, verbs.QPAttrState},
		{verbs.QPAttr{QPState: verbs.StateRTS, SQPSN: verbs.RandomPSN()}, verbs.QPAttrState | verbs.QPAttrSQPSN},
	}
	for _, s := range steps {
		if err := qp.ModifyQP(&s.attr, s.mask); err != nil {
			t.Fatalf("UD ModifyQP to %v: %v", s.attr.QPState, err)
		}
	}
	return qp
}

package verbstest

import (
	"bytes"
	"testing"

	"github.com/softrnic/softrnic/verbs"
)

// MustReg registers buf in pd with access and fails the test on error.
func MustReg(t testing.TB, pd *verbs.PD, buf []byte, access verbs.AccessFlags) *verbs.MR {
	t.Helper()
	mr, err := pd.RegMR(buf, access)
	if err != nil {
		t.Fatalf("RegMR(%d bytes, %#x): %v", len(buf), access, err)
	}
	return mr
}

// SGL is a scatter/gather list of one element: n bytes of mr from offset off.
func SGL(mr *verbs.MR, off, n int) []verbs.SGE { return []verbs.SGE{mr.SGE(off, n)} }

// MustPostSend posts wrs and fails the test on error.
func MustPostSend(t testing.TB, qp *verbs.QP, wrs ...verbs.SendWR) {
	t.Helper()
	if err := qp.PostSend(wrs); err != nil {
		t.Fatalf("PostSend: %v", err)
	}
}

// MustPostRecv posts wrs and fails the test on error.
func MustPostRecv(t testing.TB, qp *verbs.QP, wrs ...verbs.RecvWR) {
	t.Helper()
	if err := qp.PostRecv(wrs); err != nil {
		t.Fatalf("PostRecv: %v", err)
	}
}

// CheckBytes reports where got differs from want.
func CheckBytes(t testing.TB, what string, got, want []byte) {
	t.Helper()
	if bytes.Equal(got, want) {
		return
	}
	if len(got) != len(want) {
		t.Errorf("%s: %d bytes, want %d", what, len(got), len(want))
		return
	}
	firstDiff, n := -1, 0
	for i := range got {
		if got[i] != want[i] {
			if firstDiff < 0 {
				firstDiff = i
			}
			n++
		}
	}
	t.Errorf("%s: %d of %d bytes differ, first at offset %d (got %#x, want %#x)",
		what, n, len(got), firstDiff, got[firstDiff], want[firstDiff])
}

package msg

import (
	"errors"
	"testing"

	"github.com/softrnic/softrnic/cm"
)

// A peer's failure says which rank, and keeps the connection's cause testable: a caller
// tells a restarted peer from an unreachable one with errors.Is.
func TestErrPeerKeepsCause(t *testing.T) {
	for _, cause := range []error{cm.ErrPeerRestarted, cm.ErrPeerUnreachable, cm.ErrTimeout} {
		err := errPeer(3, cause)
		if !errors.Is(err, ErrPeerGone) || !errors.Is(err, cause) {
			t.Errorf("errPeer(3, %v) = %v: not ErrPeerGone and its cause", cause, err)
		}
	}
}

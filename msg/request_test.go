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

// A configuration no job can run with, and a launcher environment set by half, are
// ErrInvalid.
func TestConfigErrorsInvalid(t *testing.T) {
	for _, c := range []Config{{Threshold: 2}, {Slots: 1}, {Phases: []int{4096, 1024}}} {
		if err := c.defaults(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: %v, want ErrInvalid", c, err)
		}
	}
	t.Setenv("PMI_RANK", "1")
	t.Setenv("PMI_SIZE", "")
	if err := FromEnv(&Config{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("PMI_RANK without PMI_SIZE: %v, want ErrInvalid", err)
	}
}

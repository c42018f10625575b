package cm

import (
	"errors"
	"strings"

	"github.com/softrnic/softrnic/verbs"
)

// callError is the error of a refused or failed call: "cm: Dial: " and the reason. It
// wraps the reason, so that errors.Is and errors.As see through it (ErrTimeout,
// *RejectError, the context's error, ...).
type callError struct {
	op  string
	err error
}

func (e *callError) Error() string {
	// The reasons of this package start with "cm: " (and some with the call's name
	// already): said once.
	msg := strings.TrimPrefix(e.err.Error(), "cm: ")
	msg = strings.TrimPrefix(msg, e.op+": ")
	return "cm: " + e.op + ": " + msg
}

func (e *callError) Unwrap() error { return e.err }

// nameCall makes *err, if not nil, an error that names op, the exported call returning it
// (deferred at the call's start).
func nameCall(op string, err *error) {
	if *err == nil {
		return
	}
	var ce *callError
	if errors.As(*err, &ce) && ce.op == op {
		return
	}
	*err = &callError{op: op, err: *err}
}

// errDeviceClosed is the reason of a call on a device that was closed: it matches
// ErrClosed and, through its cause, verbs.ErrClosed.
var errDeviceClosed error = deviceClosed{}

type deviceClosed struct{}

func (deviceClosed) Error() string        { return "the device was closed" }
func (deviceClosed) Is(target error) bool { return target == ErrClosed }
func (deviceClosed) Unwrap() error        { return verbs.ErrClosed }

// errListenerClosed is the reason of a call on a listener that was closed.
var errListenerClosed error = listenerClosed{}

type listenerClosed struct{}

func (listenerClosed) Error() string        { return "the listener was closed" }
func (listenerClosed) Is(target error) bool { return target == ErrClosed }

// isClosed reports whether the device was closed (its connection manager with it).
func (m *manager) isClosed() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.closed
}

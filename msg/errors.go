package msg

import (
	"errors"
	"fmt"
	"strings"
)

// ErrInvalid is wrapped by the errors of calls given arguments that cannot be right: a
// rank the job does not have, a negative tag, slices of the wrong length, an unknown Op
// or, in Init, a rank outside Config.Size.
var ErrInvalid = errors.New("invalid argument")

// String returns the reduction's name, "SUM", "MIN" or "MAX" (as MPI_SUM, ...).
func (o Op) String() string {
	switch o {
	case Sum:
		return "SUM"
	case Min:
		return "MIN"
	case Max:
		return "MAX"
	}
	return fmt.Sprintf("Op(%d)", int(o))
}

// noRank says that rank r is not one of the job's size ranks (wrapping ErrInvalid);
// what names the call and its arguments, e.g. "send to rank 5 with tag 1".
func noRank(what string, r, size int) error {
	return fmt.Errorf("msg: %s: %w: there is no rank %d in a job of %d ranks (0 to %d)", what, ErrInvalid, r, size, size-1)
}

// closedError is the error of a call on a closed communicator: it names the call (what)
// and matches ErrClosed.
func closedError(what string) error { return &commClosed{what} }

type commClosed struct{ what string }

func (e *commClosed) Error() string        { return "msg: " + e.what + ": the communicator was closed" }
func (e *commClosed) Is(target error) bool { return target == ErrClosed }

// callError names the call an error came through ("msg: Barrier: ..."): after Close the
// communicator's closing, otherwise the reason, with its own "msg: " said once. It
// wraps the reason for errors.Is and errors.As.
func callError(op string, err error) error {
	if errors.Is(err, ErrClosed) {
		return closedError(op)
	}
	return &opError{op, err}
}

type opError struct {
	op  string
	err error
}

func (e *opError) Error() string {
	return "msg: " + e.op + ": " + strings.TrimPrefix(e.err.Error(), "msg: ")
}
func (e *opError) Unwrap() error { return e.err }

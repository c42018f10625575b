package rsocket_test

import (
	"errors"
	"net"
	"sync"
	"testing"

	"github.com/softrnic/softrnic/rsocket"
	"github.com/softrnic/softrnic/verbs"
)

// TestCloseConcurrent closes each side of a connection from several goroutines at
// once, as net/http's server does when Shutdown closes an idle connection while the
// connection's own goroutine closes it: one Close closes the connection, the others
// return an error wrapping net.ErrClosed, and none panics.
func TestCloseConcurrent(t *testing.T) {
	const closers = 4
	for range 20 {
		c, s := pair(t, rsocket.Options{}, verbs.DeviceConfig{})
		for _, conn := range []*rsocket.Conn{c, s} {
			var start, wg sync.WaitGroup
			start.Add(1)
			errs := make([]error, closers)
			for i := range closers {
				wg.Go(func() {
					start.Wait()
					errs[i] = conn.Close()
				})
			}
			start.Done()
			wg.Wait()
			ok := 0
			for _, err := range errs {
				switch {
				case err == nil:
					ok++
				case !errors.Is(err, net.ErrClosed):
					t.Errorf("Close: %v", err)
				}
			}
			if ok != 1 {
				t.Errorf("%d of %d concurrent Closes succeeded, want 1: %v", ok, closers, errs)
			}
		}
	}
}

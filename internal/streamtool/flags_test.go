package streamtool

import (
	"flag"
	"testing"
	"time"

	"github.com/softrnic/softrnic/rsocket"
)

// --busy-poll: rsocket's default when absent, 0 for none (a negative BusyPoll).
func TestBusyPollFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		want time.Duration
		set  bool
	}{
		{nil, rsocket.DefaultBusyPoll, false},
		{[]string{"--busy-poll", "0"}, -1, true},
		{[]string{"--busy-poll", "200us"}, 200 * time.Microsecond, true},
	} {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		var d time.Duration
		set := BusyPollFlag(fs, &d)
		if err := fs.Parse(c.args); err != nil {
			t.Fatal(err)
		}
		if d != c.want || set() != c.set {
			t.Errorf("%q: %v (set %v), want %v (set %v)", c.args, d, set(), c.want, c.set)
		}
	}
}

package streamtool

import (
	"flag"
	"time"

	"github.com/softrnic/softrnic/rsocket"
)

// BusyPollFlag defines the tools' --busy-poll on fs, writing into dst what
// rsocket.Options.BusyPoll takes: the duration given (default rsocket.DefaultBusyPoll),
// or -1 (sleep at once) for 0. set says whether the command line gave it.
func BusyPollFlag(fs *flag.FlagSet, dst *time.Duration) (set func() bool) {
	b := &busyPoll{d: dst}
	*dst = rsocket.DefaultBusyPoll
	fs.Var(b, "busy-poll", "how long a call that must wait polls before it sleeps (0: it sleeps at once)")
	return func() bool { return b.set }
}

type busyPoll struct {
	d   *time.Duration
	set bool
}

func (b *busyPoll) String() string {
	if b.d == nil {
		return rsocket.DefaultBusyPoll.String()
	}
	return max(*b.d, 0).String()
}

func (b *busyPoll) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	if d <= 0 {
		d = -1
	}
	*b.d, b.set = d, true
	return nil
}

package rsocket

import (
	"testing"
	"time"
)

// Options' zero value is librdmacm's sizes and a waiting call that polls for
// DefaultBusyPoll; a negative BusyPoll sleeps at once and stays negative.
func TestOptionsDefaults(t *testing.T) {
	o, err := Options{}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if o.RecvBuffer != DefaultBuffer || o.SendBuffer != DefaultBuffer || o.QueueSize != DefaultQueueSize ||
		o.InlineSize != DefaultInlineSize || o.BusyPoll != DefaultBusyPoll {
		t.Errorf("defaults: %+v", o)
	}
	if o, _ := (Options{BusyPoll: -1}).withDefaults(); o.BusyPoll >= 0 {
		t.Errorf("BusyPoll -1 became %v", o.BusyPoll)
	}
	if o, _ := (Options{BusyPoll: time.Millisecond}).withDefaults(); o.BusyPoll != time.Millisecond {
		t.Errorf("BusyPoll 1ms became %v", o.BusyPoll)
	}
	if _, err := (Options{RecvBuffer: 4097}).withDefaults(); err == nil {
		t.Error("an odd RecvBuffer: no error")
	}
}

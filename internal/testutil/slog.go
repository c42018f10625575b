package testutil

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// LogRecord is a record a LogRecorder kept: its level, message and attributes (values
// as text).
type LogRecord struct {
	Level slog.Level
	Msg   string
	Attrs map[string]string
}

func (r LogRecord) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%v %q", r.Level, r.Msg)
	for k, v := range r.Attrs {
		fmt.Fprintf(&b, " %s=%s", k, v)
	}
	return b.String()
}

// LogRecorder is a slog.Handler that keeps every record, for a test to wait for the
// ones it expects.
type LogRecorder struct {
	mu      sync.Mutex
	records []LogRecord
	added   chan struct{} // closed and replaced when a record is added
}

// NewLogRecorder returns an empty recorder; Logger returns a logger writing to it.
func NewLogRecorder() *LogRecorder { return &LogRecorder{added: make(chan struct{})} }

// Logger returns a logger whose records go to the recorder (every level).
func (h *LogRecorder) Logger() *slog.Logger { return slog.New(h) }

// Enabled is true at every level.
func (h *LogRecorder) Enabled(context.Context, slog.Level) bool { return true }

// Handle keeps the record.
func (h *LogRecorder) Handle(_ context.Context, r slog.Record) error {
	rec := LogRecord{Level: r.Level, Msg: r.Message, Attrs: map[string]string{}}
	r.Attrs(func(a slog.Attr) bool {
		rec.Attrs[a.Key] = a.Value.String()
		return true
	})
	h.mu.Lock()
	h.records = append(h.records, rec)
	close(h.added)
	h.added = make(chan struct{})
	h.mu.Unlock()
	return nil
}

// WithAttrs and WithGroup are not used by the code under test: the records stay flat.
func (h *LogRecorder) WithAttrs([]slog.Attr) slog.Handler { return h }

// WithGroup returns the recorder itself.
func (h *LogRecorder) WithGroup(string) slog.Handler { return h }

// Records returns the records kept so far.
func (h *LogRecorder) Records() []LogRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]LogRecord(nil), h.records...)
}

// Wait returns the first record with message msg, waiting for it (up to WaitLimit, then
// the test fails with the records seen).
func (h *LogRecorder) Wait(t testing.TB, msg string) LogRecord {
	t.Helper()
	ctx := Context(t)
	for {
		h.mu.Lock()
		for _, r := range h.records {
			if r.Msg == msg {
				h.mu.Unlock()
				return r
			}
		}
		added := h.added
		h.mu.Unlock()
		select {
		case <-added:
		case <-ctx.Done():
			t.Fatalf("no log record %q; got %v", msg, h.Records())
		}
	}
}

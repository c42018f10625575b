package main

import (
	"context"
	"io"
	"strings"
	"testing"
)

// riostream's flags: rstream's without -k; -T s refused with the reason.
func TestParseArgs(t *testing.T) {
	cfg, _, err := parseArgs([]string{"-s", "127.0.0.2", "-S", "4096", "-C", "10", "-I", "3", "-B", "65536", "-T", "v", "-T", "b", "-p", "7000"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Custom || cfg.Size != 4096 || cfg.Count != 10 || cfg.Iters != 3 || cfg.Buffer != 65536 || !cfg.Verify || cfg.Port != 7000 || !cfg.client() {
		t.Errorf("parsed %+v", cfg)
	}
	if cfg, _, err = parseArgs([]string{"-b", "127.0.0.2", "-S", "all"}, io.Discard); err != nil || !cfg.AllSizes || cfg.Custom {
		t.Errorf("-S all: %+v, %v", cfg, err)
	}
	var stderr strings.Builder
	if _, _, err := parseArgs([]string{"-T", "s"}, &stderr); err == nil || !strings.Contains(stderr.String(), "only over rsockets") {
		t.Errorf("-T s: %v\n%s", err, stderr.String())
	}
	for _, bad := range [][]string{{"-T", "socket"}, {"-T", "f"}, {"-T", "x"}, {"-k", "5"}, {"-C", "ten"}, {"-f", "gid"}, {"--ordering", "weak"}, {"extra"}} {
		if _, _, err := parseArgs(bad, io.Discard); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	// A server needs a device address.
	c := Config{Port: 7471}
	if err := run(context.Background(), &c, &output{Out: io.Discard, Log: io.Discard}); err == nil || !strings.Contains(err.Error(), "-b ADDR") {
		t.Errorf("server without an address: %v", err)
	}
}

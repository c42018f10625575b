package perf

import (
	"os"
	"path/filepath"
	"testing"
)

func TestStartCPUProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu.pprof")
	stop, err := StartCPUProfile(path)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if fi, err := os.Stat(path); err != nil || fi.Size() == 0 {
		t.Fatalf("profile %s: %v (want a non-empty file)", path, err)
	}
	if _, err := StartCPUProfile(filepath.Join(t.TempDir(), "no", "such", "dir")); err == nil {
		t.Fatal("StartCPUProfile into a missing directory: no error")
	}
}

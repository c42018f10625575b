package streamtool

import "testing"

// The tools' number formats and line.
func TestFormat(t *testing.T) {
	for n, want := range map[int64]string{64: "64", 1000: "1000", 1536: "1.5k", 4096: "4k", 12288: "12k", 65536: "64k",
		1 << 20: "1m", 1572864: "1.5m", 6 << 20: "6m", 12800000: "12m", 1 << 31: "2g", 1<<30 + 1<<29: "1.5g"} {
		if got := SizeStr(n); got != want {
			t.Errorf("SizeStr(%d) = %q, want %q", n, got, want)
		}
	}
	for n, want := range map[int64]string{1: "1", 999: "999", 1000: "1k", 100000: "100k", 2500000: "2m", 3e9: "3b"} {
		if got := CntStr(n); got != want {
			t.Errorf("CntStr(%d) = %q, want %q", n, got, want)
		}
	}
	r := Result{Test: "64_lat", Size: 64, Xfers: 1, Iters: 100000, Bytes: 12800000, Seconds: 1.5, Gbps: 0.068266, UsecPerXfer: 7.5}
	want := "64_lat    64      1       100k    12m         1.50s      0.07       7.50\n"
	if got := r.Row(); got != want {
		t.Errorf("row %q\nwant %q", got, want)
	}
	if got := TestName(1<<20+1<<19, "bw"); got != "1.5m_bw" {
		t.Errorf("TestName: %q", got)
	}
}

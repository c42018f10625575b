//go:build unix

package verbs_test

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkFirstTouch measures what a fresh page costs when it is first written (a page
// fault) and what it costs once resident, in ns per 4 KiB page (first_ns/page,
// resident_ns/page): what registering fresh memory, or placing into it, pays per page.
func BenchmarkFirstTouch(b *testing.B) {
	const size, page = 1 << 20, 4096
	var first, again time.Duration
	for b.Loop() {
		mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		if err != nil {
			b.Fatal(err)
		}
		t := time.Now()
		for i := 0; i < size; i += page {
			mem[i] = 1
		}
		first += time.Since(t)
		t = time.Now()
		for i := 0; i < size; i += page {
			mem[i] = 2
		}
		again += time.Since(t)
		unix.Munmap(mem)
	}
	pages := float64(b.N) * size / page
	b.ReportMetric(float64(first.Nanoseconds())/pages, "first_ns/page")
	b.ReportMetric(float64(again.Nanoseconds())/pages, "resident_ns/page")
}

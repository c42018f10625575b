package main

import (
	"fmt"
	"strings"
)

// sizeStr formats a byte count as rstream's tables show it: whole units of k, m or g
// (powers of 1024), with one decimal when below ten units and not whole ("1.5k", "64k",
// "1m"), or plain bytes below 1 KiB.
func sizeStr(n int64) string {
	base, mag := int64(1), ""
	switch {
	case n >= 1<<30:
		base, mag = 1<<30, "g"
	case n >= 1<<20:
		base, mag = 1<<20, "m"
	case n >= 1<<10:
		base, mag = 1<<10, "k"
	}
	var frac int64
	if n/base < 10 {
		frac = n % base * 10 / base
	}
	if frac != 0 {
		return fmt.Sprintf("%d.%d%s", n/base, frac, mag)
	}
	return fmt.Sprintf("%d%s", n/base, mag)
}

// cntStr formats a count as rstream's tables show it: truncated to whole thousands (k),
// millions (m) or billions (b).
func cntStr(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%db", n/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%dm", n/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%dk", n/1e3)
	}
	return fmt.Sprint(n)
}

// testName is a size test's name: its size as sizeStr gives it, cut to the four
// characters rstream keeps, then the kind ("64_lat", "1.5m_bw").
func testName(size int, kind string) string {
	s := sizeStr(int64(size))
	if len(s) > 4 {
		s = s[:4]
	}
	return s + "_" + kind
}

// header is rstream's column titles.
func header() string {
	return fmt.Sprintf("%-10s%-8s%-8s%-8s%-8s%8s %10s%13s\n",
		"name", "bytes", "xfers", "iters", "total", "time", "Gb/sec", "usec/xfer")
}

// Row formats r as rstream's result line: the name, the transfer size, the transfers per
// iteration, the iterations, the bytes moved both ways, the seconds, the rate in Gbit/s
// (decimal) and the microseconds per transfer (a transfer is one direction's).
func (r *Result) Row() string {
	name := r.Test
	if len(name) > 9 {
		name = name[:9] // rstream's name buffer holds 9 characters
	}
	return fmt.Sprintf("%-10s%-8s%-8s%-8s%-8s%8.2fs%10.2f%11.2f\n",
		name, sizeStr(int64(r.Size)), cntStr(int64(r.Xfers)), cntStr(int64(r.Iters)), sizeStr(r.Bytes),
		r.Seconds, r.Gbps, r.UsecPerXfer)
}

// pattern is rstream's data check (-T v): every byte sent is the next value of a
// counter that runs on over every transfer of the run (mod 256), and every byte received
// must be the next value of a second counter. Both sides start at 0 and move the same
// number of bytes each way, so the counters stay in step; a side that does not check
// echoes what it received, which is the pattern too.
type pattern struct {
	send, recv byte
	checked    int64 // bytes received and found right, over the run
}

// fill writes the next len(b) bytes of the pattern into b.
func (p *pattern) fill(b []byte) {
	v := p.send
	for i := range b {
		b[i] = v
		v++
	}
	p.send = v
}

// check compares b with the next len(b) bytes of the pattern; its error, in rstream's
// words, counts from the first byte the run received.
func (p *pattern) check(b []byte) error {
	v := p.recv
	for i, x := range b {
		if x != v {
			return fmt.Errorf("data verification failed byte %d", p.checked+int64(i))
		}
		v++
	}
	p.recv = v
	p.checked += int64(len(b))
	return nil
}

// testOption is one -T letter or word: what it selects, as rstream reads it (one letter,
// or a word by its first letters, case aside).
type testOption struct {
	letter byte
	word   string
	what   string
	// note is why the option changes nothing here ("" if it does something).
	note string
}

var testOptions = []testOption{
	{'s', "socket", "use the kernel's TCP sockets (Go's net package), no rsockets", ""},
	{'a', "async", "asynchronous operation (poll)", "Go's reads and writes block their goroutine: there is nothing to poll"},
	{'b', "block", "blocking calls", "Go's reads and writes are blocking calls"},
	{'f', "fork", "fork the server's processing (implies s)", "the server serves each connection itself, without forking"},
	{'n', "nonblock", "non-blocking calls", "Go's reads and writes block their goroutine (the runtime polls)"},
	{'r', "resolve", "resolve addresses through rdma_cm", "softrnic's addresses are IP addresses, resolved as such"},
	{'v', "verify", "verify data", ""},
}

// lookupTestOption finds -T arg's option: one letter, or a longer argument that starts
// with the option's word ("sockets", "Verify").
func lookupTestOption(arg string) (testOption, bool) {
	for _, o := range testOptions {
		if len(arg) == 1 && arg[0] == o.letter || len(arg) > 1 && strings.HasPrefix(strings.ToLower(arg), o.word) {
			return o, true
		}
	}
	return testOption{}, false
}

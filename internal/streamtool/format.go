package streamtool

import (
	"fmt"
	"strings"
)

// SizeStr formats a byte count as the tools' tables show it: whole units of k, m or g
// (powers of 1024), with one decimal when below ten units and not whole ("1.5k", "64k",
// "1m"), or plain bytes below 1 KiB.
func SizeStr(n int64) string {
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

// CntStr formats a count as the tools' tables show it: truncated to whole thousands (k),
// millions (m) or billions (b).
func CntStr(n int64) string {
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

// TestName is a size test's name: its size as SizeStr gives it, cut to the four
// characters the tools keep, then the kind ("64_lat", "1.5m_bw").
func TestName(size int, kind string) string {
	s := SizeStr(int64(size))
	if len(s) > 4 {
		s = s[:4]
	}
	return s + "_" + kind
}

// Header is the tools' column titles.
func Header() string {
	return fmt.Sprintf("%-10s%-8s%-8s%-8s%-8s%8s %10s%13s\n",
		"name", "bytes", "xfers", "iters", "total", "time", "Gb/sec", "usec/xfer")
}

// Row formats r as the tools' result line: the name, the transfer size, the transfers per
// iteration, the iterations, the bytes moved both ways, the seconds, the rate in Gbit/s
// (decimal) and the microseconds per transfer (a transfer is one direction's).
func (r *Result) Row() string {
	name := r.Test
	if len(name) > 9 {
		name = name[:9] // the tools' name buffer holds 9 characters
	}
	return fmt.Sprintf("%-10s%-8s%-8s%-8s%-8s%8.2fs%10.2f%11.2f\n",
		name, SizeStr(int64(r.Size)), CntStr(int64(r.Xfers)), CntStr(int64(r.Iters)), SizeStr(r.Bytes),
		r.Seconds, r.Gbps, r.UsecPerXfer)
}

// Pattern is the tools' data check (-T v, common.c's format_buf and verify_buf): every
// byte sent is the next value of a counter that runs on over every transfer of the run
// (mod 256), and every byte received must be the next value of a second counter. Both
// sides start at 0 and move the same number of bytes each way, so the counters stay in
// step; a side of rstream that does not check echoes what it received, which is the
// pattern too.
type Pattern struct {
	send, recv byte
	checked    int64 // bytes received and found right, over the run
}

// Fill writes the next len(b) bytes of the pattern into b.
func (p *Pattern) Fill(b []byte) {
	v := p.send
	for i := range b {
		b[i] = v
		v++
	}
	p.send = v
}

// Check compares b with the next len(b) bytes of the pattern; its error, in the C
// tools' words, counts from the first byte the run received.
func (p *Pattern) Check(b []byte) error {
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

// TestOption is one -T letter or word: what it selects, as the C tools read it (one
// letter, or a word by its first letters, case aside).
type TestOption struct {
	Letter byte
	Word   string
	What   string
	// Note is why the option changes nothing here ("" if it does something).
	Note string
}

// LookupTestOption finds -T arg's option among opts: one letter, or a longer argument
// that starts with the option's word ("sockets", "Verify").
func LookupTestOption(opts []TestOption, arg string) (TestOption, bool) {
	for _, o := range opts {
		if len(arg) == 1 && arg[0] == o.Letter || len(arg) > 1 && strings.HasPrefix(strings.ToLower(arg), o.Word) {
			return o, true
		}
	}
	return TestOption{}, false
}

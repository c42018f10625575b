// Package pcap writes packet captures in the classic pcap format (what tcpdump writes and
// tshark and Wireshark read): one IP datagram per record, link type RAW (an IPv4 or IPv6
// header first, no link-layer header). softrnic's tap writes through it what a real link
// would carry for each RoCEv2 packet a device sends and receives.
package pcap

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"sync"
	"time"
)

// LinkTypeRaw is the pcap link type of raw IP packets.
const LinkTypeRaw = 101

// snapLen is the longest record the file announces: an IPv6 header, UDP, and a 64 KiB
// datagram.
const snapLen = 65535 + 48

// Writer writes records to a pcap file. It is safe for concurrent use. Once the file
// holds Limit bytes, records are counted as dropped instead of written.
type Writer struct {
	mu      sync.Mutex
	w       *bufio.Writer
	c       io.Closer
	limit   int64
	written int64
	dropped uint64
	err     error
	rec     []byte // scratch: the headers of a record
}

// ErrClosed is returned by operations on a closed Writer.
var ErrClosed = errors.New("pcap: writer closed")

// NewWriter starts a capture on w (closed by Close if it is an io.Closer) that stops
// growing at limit bytes (0: no limit).
func NewWriter(w io.Writer, limit int64) (*Writer, error) {
	pw := &Writer{w: bufio.NewWriterSize(w, 64<<10), limit: limit, rec: make([]byte, 0, 16+40+8)}
	if c, ok := w.(io.Closer); ok {
		pw.c = c
	}
	var h [24]byte
	binary.LittleEndian.PutUint32(h[0:], 0xa1b23c4d) // nanosecond timestamps
	binary.LittleEndian.PutUint16(h[4:], 2)
	binary.LittleEndian.PutUint16(h[6:], 4)
	binary.LittleEndian.PutUint32(h[16:], snapLen)
	binary.LittleEndian.PutUint32(h[20:], LinkTypeRaw)
	if _, err := pw.w.Write(h[:]); err != nil {
		return nil, err
	}
	pw.written = int64(len(h))
	return pw, nil
}

// Datagram describes one UDP datagram as a link carries it.
type Datagram struct {
	Src, Dst netip.AddrPort
	// ID is the IPv4 identification; DF the Don't Fragment flag; TTL the time to live (or
	// IPv6 hop limit; 0 means 64).
	ID  uint16
	DF  bool
	TTL uint8
}

// WriteUDP writes one record: an IP header and a UDP header (with correct checksums) for
// d, followed by the payload, given in pieces.
func (pw *Writer) WriteUDP(ts time.Time, d *Datagram, payload ...[]byte) error {
	n := 0
	for _, p := range payload {
		n += len(p)
	}
	v4 := d.Src.Addr().Unmap().Is4() && d.Dst.Addr().Unmap().Is4()
	ipLen := 40
	if v4 {
		ipLen = 20
	}
	total := ipLen + 8 + n
	pw.mu.Lock()
	defer pw.mu.Unlock()
	if pw.w == nil {
		return ErrClosed
	}
	if pw.err != nil {
		return pw.err
	}
	if total > snapLen || pw.limit > 0 && pw.written+16+int64(total) > pw.limit {
		pw.dropped++
		return nil
	}
	b := pw.rec[:16+ipLen+8]
	clear(b)
	binary.LittleEndian.PutUint32(b[0:], uint32(ts.Unix()))
	binary.LittleEndian.PutUint32(b[4:], uint32(ts.Nanosecond()))
	binary.LittleEndian.PutUint32(b[8:], uint32(total))
	binary.LittleEndian.PutUint32(b[12:], uint32(total))
	ip, udp := b[16:16+ipLen], b[16+ipLen:]
	ttl := d.TTL
	if ttl == 0 {
		ttl = 64
	}
	udpLen := 8 + n
	var sum uint32 // the UDP pseudo-header
	if v4 {
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(total))
		binary.BigEndian.PutUint16(ip[4:], d.ID)
		if d.DF {
			ip[6] = 0x40
		}
		ip[8], ip[9] = ttl, 17
		s, t := d.Src.Addr().Unmap().As4(), d.Dst.Addr().Unmap().As4()
		copy(ip[12:16], s[:])
		copy(ip[16:20], t[:])
		binary.BigEndian.PutUint16(ip[10:], ^fold(sumBytes(0, ip)))
		sum = sumBytes(sumBytes(0, s[:]), t[:]) + 17 + uint32(udpLen)
	} else {
		ip[0] = 0x60
		binary.BigEndian.PutUint16(ip[4:], uint16(udpLen))
		ip[6], ip[7] = 17, ttl
		s, t := d.Src.Addr().As16(), d.Dst.Addr().As16()
		copy(ip[8:24], s[:])
		copy(ip[24:40], t[:])
		sum = sumBytes(sumBytes(0, s[:]), t[:]) + 17 + uint32(udpLen)
	}
	binary.BigEndian.PutUint16(udp[0:], d.Src.Port())
	binary.BigEndian.PutUint16(udp[2:], d.Dst.Port())
	binary.BigEndian.PutUint16(udp[4:], uint16(udpLen))
	sum = sumBytes(sum, udp)
	odd := false
	for _, p := range payload {
		sum, odd = sumOdd(sum, p, odd)
	}
	c := ^fold(sum)
	if c == 0 {
		c = 0xFFFF // 0 means "no checksum"
	}
	binary.BigEndian.PutUint16(udp[6:], c)
	pw.write(b)
	for _, p := range payload {
		pw.write(p)
	}
	pw.written += 16 + int64(total)
	return pw.err
}

func (pw *Writer) write(p []byte) {
	if pw.err == nil {
		_, pw.err = pw.w.Write(p)
	}
}

// Dropped returns how many records did not fit the limit.
func (pw *Writer) Dropped() uint64 {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	return pw.dropped
}

// Flush writes what is buffered.
func (pw *Writer) Flush() error {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	if pw.w == nil {
		return ErrClosed
	}
	if pw.err == nil {
		pw.err = pw.w.Flush()
	}
	return pw.err
}

// Close flushes the capture and closes the underlying writer if it is an io.Closer.
func (pw *Writer) Close() error {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	if pw.w == nil {
		return ErrClosed
	}
	err := pw.w.Flush()
	if pw.err != nil {
		err = pw.err
	}
	pw.w = nil
	if pw.c != nil {
		if cerr := pw.c.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

// sumBytes adds b to a ones' complement sum as big-endian 16-bit words (b of even length).
func sumBytes(sum uint32, b []byte) uint32 {
	s, _ := sumOdd(sum, b, false)
	return s
}

// sumOdd adds b to the sum; odd says the previous piece ended in the middle of a word.
func sumOdd(sum uint32, b []byte, odd bool) (uint32, bool) {
	if odd && len(b) > 0 {
		sum += uint32(b[0])
		b = b[1:]
		odd = false
	}
	for len(b) >= 2 {
		sum += uint32(b[0])<<8 | uint32(b[1])
		b = b[2:]
		if sum >= 1<<31 {
			sum = sum&0xFFFF + sum>>16
		}
	}
	if len(b) == 1 {
		sum += uint32(b[0]) << 8
		odd = true
	}
	return sum, odd
}

func fold(sum uint32) uint16 {
	for sum > 0xFFFF {
		sum = sum&0xFFFF + sum>>16
	}
	return uint16(sum)
}

// Record is one packet of a capture: its time and its bytes (the IP datagram, for a
// capture of link type RAW).
type Record struct {
	Time time.Time
	Data []byte
}

// ReadAll reads every record of a pcap capture (microsecond or nanosecond timestamps,
// either byte order) and returns them with the capture's link type.
func ReadAll(r io.Reader) (recs []Record, linkType uint32, err error) {
	var h [24]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, 0, fmt.Errorf("pcap: header: %w", err)
	}
	var bo binary.ByteOrder = binary.LittleEndian
	nano := false
	switch magic := binary.LittleEndian.Uint32(h[:]); magic {
	case 0xa1b2c3d4:
	case 0xa1b23c4d:
		nano = true
	case 0xd4c3b2a1:
		bo = binary.BigEndian
	case 0x4d3cb2a1:
		bo, nano = binary.BigEndian, true
	default:
		return nil, 0, fmt.Errorf("pcap: not a pcap file (magic %#x)", magic)
	}
	linkType = bo.Uint32(h[20:])
	for {
		var rh [16]byte
		if _, err := io.ReadFull(r, rh[:]); err == io.EOF {
			return recs, linkType, nil
		} else if err != nil {
			return recs, linkType, fmt.Errorf("pcap: record %d: %w", len(recs), err)
		}
		sec, frac, n := bo.Uint32(rh[0:]), bo.Uint32(rh[4:]), bo.Uint32(rh[8:])
		if n > snapLen {
			return recs, linkType, fmt.Errorf("pcap: record %d of %d bytes", len(recs), n)
		}
		if !nano {
			frac *= 1000
		}
		data := make([]byte, n)
		if _, err := io.ReadFull(r, data); err != nil {
			return recs, linkType, fmt.Errorf("pcap: record %d: %w", len(recs), err)
		}
		recs = append(recs, Record{Time: time.Unix(int64(sec), int64(frac)), Data: data})
	}
}

package perf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/softrnic/softrnic/verbs"
)

// perftest's out-of-band exchange (linux-rdma/perftest, the 4.5-0.17 release Debian 12
// ships, which calls itself "6.06"), as it goes over the TCP connection to port 18515
// without rdma_cm (-R; with it the same steps go over an RC QP, perftest_cm.go):
//
//   - Every step is one fixed-size message each way, in lockstep: the client (the side
//     given a server name) writes its message and then reads the server's; the server
//     reads first and then writes. perftest reads each message with one read(2) of
//     exactly its size, so each message here goes out in one write.
//   - The version: 16 bytes, the version string ("6.06") padded with NULs. A peer below
//     5.70 is refused, as perftest refuses it.
//   - If the peer's version is at least 5.32: the cycle buffer (the page size) and the
//     cache line size, each a 4-byte big-endian int; both sides use the larger of the two.
//   - If at least 5.1: the port's MTU as its ibv_mtu enum in decimal ASCII, NUL-terminated,
//     in 2 bytes (4 bytes for peers below 5.31); both sides use the smaller.
//   - The handshake (ctx_hand_shake), several times in each test: each side's
//     pingpong_dest as a 108-byte string, "%04x:%04x:%06x:%06x:%08x:%016llx:" (LID,
//     outstanding reads, QPN, PSN, rkey, address) then the 16 GID bytes as "%02x:" each,
//     then "%08x:" (SRQ number) and a NUL. Only the first handshake per QP carries
//     information; the later ones are synchronisation points (the same string again).
//   - The bandwidth report (xchg_bw_reports, write/read/atomic_bw): five steps of 8
//     bytes, big-endian: size, iterations (peers from 5.33 on; 4 bytes before), peak,
//     average and message rate as IEEE-754 doubles. Only the client's means anything: the
//     server prints it (perftest's server sends its own uninitialised stack).
//   - At the end (ctx_close_connection): a handshake, then "done" with its NUL (5 bytes)
//     from each side, which neither reads; write_lat does not close at all.

// ptVersion is the version rperf's perftest mode speaks: perftest 4.5-0.17's.
const ptVersion = "6.06"

// Sizes of the exchange's messages.
const (
	ptVersionLen = 16  // MAX_VERSION
	ptDestLen    = 108 // KEY_MSG_SIZE_GID
	ptMTULen     = 2   // sizeof(char[2]), peers from 5.31 on
)

// ptMinVersion is the oldest peer perftest 4.5 (and so rperf) works with.
const ptMinVersion = 5.70

// ptDone is what each side writes after the closing handshake.
var ptDone = []byte("done\x00")

// ptDest is perftest's struct pingpong_dest as it goes over the wire.
type ptDest struct {
	LID      uint16
	OutReads uint16 // the READ/atomic responder resources this side gives
	QPN      uint32
	PSN      uint32
	RKey     uint32
	VAddr    uint64
	GID      verbs.GID
	SRQN     uint32
}

// marshal formats d as perftest's KEY_PRINT_FMT_GID does, NUL-terminated: 108 bytes.
func (d ptDest) marshal() []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "%04x:%04x:%06x:%06x:%08x:%016x:", d.LID, d.OutReads, d.QPN&0xFFFFFF, d.PSN&0xFFFFFF, d.RKey, d.VAddr)
	for _, g := range d.GID {
		fmt.Fprintf(&b, "%02x:", g)
	}
	fmt.Fprintf(&b, "%08x:", d.SRQN)
	out := make([]byte, ptDestLen)
	copy(out, b.String()) // 107 characters and the NUL
	return out
}

// parsePtDest reads a 108-byte handshake message: 23 colon-separated hex fields before the
// NUL (perftest parses them with strtol, so a field wider than its format is accepted).
func parsePtDest(msg []byte) (ptDest, error) {
	var d ptDest
	s := msg
	if i := bytes.IndexByte(s, 0); i >= 0 {
		s = s[:i]
	}
	f := strings.Split(string(s), ":")
	if len(f) == 24 && f[23] == "" { // the trailing ':'
		f = f[:23]
	}
	if len(f) != 23 {
		return d, fmt.Errorf("perftest handshake %q: %d fields, want 23", s, len(f))
	}
	vals := make([]uint64, len(f))
	for i, x := range f {
		v, err := strconv.ParseUint(x, 16, 64)
		if err != nil {
			return d, fmt.Errorf("perftest handshake %q: field %d: %w", s, i, err)
		}
		vals[i] = v
	}
	d.LID, d.OutReads = uint16(vals[0]), uint16(vals[1])
	d.QPN, d.PSN = uint32(vals[2])&0xFFFFFF, uint32(vals[3])&0xFFFFFF
	d.RKey, d.VAddr = uint32(vals[4]), vals[5]
	for i := range d.GID {
		d.GID[i] = byte(vals[6+i])
	}
	d.SRQN = uint32(vals[22])
	return d, nil
}

// versionMessage is the 16-byte version message.
func versionMessage(v string) []byte {
	b := make([]byte, ptVersionLen)
	copy(b[:ptVersionLen-1], v)
	return b
}

// atof reads a version number as C's atof does: the longest prefix that is a number (0
// if none).
func atof(b []byte) float64 {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	s := strings.TrimLeft(string(b), " \t\n")
	end := 0
	dot := false
	for end < len(s) && (s[end] >= '0' && s[end] <= '9' || s[end] == '.' && !dot) {
		dot = dot || s[end] == '.'
		end++
	}
	v, err := strconv.ParseFloat(strings.TrimSuffix(s[:end], "."), 64)
	if err != nil {
		return 0
	}
	return v
}

// mtuMessage is the MTU step's message: the ibv_mtu enum in decimal, NUL-terminated, in
// n bytes (perftest's sprintf into a char[4], of which it sends 2 or 4).
func mtuMessage(m verbs.MTU, n int) []byte {
	b := make([]byte, n)
	copy(b[:n-1], strconv.Itoa(int(m)))
	return b
}

// parseMTUMessage returns the enum a peer sent (strtol: the leading digits), or 0.
func parseMTUMessage(b []byte) verbs.MTU {
	end := 0
	for end < len(b) && b[end] >= '0' && b[end] <= '9' {
		end++
	}
	v, _ := strconv.Atoi(string(b[:end]))
	if v < int(verbs.MTU256) || v > int(verbs.MTU4096) {
		return 0
	}
	return verbs.MTU(v)
}

// ptReport is perftest's struct bw_report_data as xchg_bw_reports sends it.
type ptReport struct {
	Size    uint64
	Iters   uint64
	Peak    float64 // MiB/s (perftest's "MB/sec")
	Avg     float64 // MiB/s
	MsgRate float64 // Mpps
}

// ptConn is the control connection of perftest's exchange: over TCP, conn writes and r
// reads (a buffered reader over the same connection, possibly one that already peeked at
// it); with -R (rc set) the messages are SENDs on an RC QP that rdma_cm connected.
type ptConn struct {
	conn   net.Conn
	r      io.Reader
	rc     *ptComm
	client bool // writes first at every step
	// remVersion is the peer's version number, once exchanged (0 before).
	remVersion float64
	remVerStr  string
}

// write sends one message of the exchange.
func (p *ptConn) write(b []byte) error {
	if p.rc != nil {
		return p.rc.send(b)
	}
	if _, err := p.conn.Write(b); err != nil {
		return fmt.Errorf("perftest exchange: %w", err)
	}
	return nil
}

// read receives one message of n bytes.
func (p *ptConn) read(n int) ([]byte, error) {
	if p.rc != nil {
		return p.rc.recv(n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(p.r, b); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("perftest exchange: the peer closed the connection (%w)", err)
		}
		return nil, fmt.Errorf("perftest exchange: %w", err)
	}
	return b, nil
}

// setDeadline bounds the wait for the peer's messages (the zero time: no bound).
func (p *ptConn) setDeadline(t time.Time) {
	if p.rc != nil {
		p.rc.deadline = t
		return
	}
	_ = p.conn.SetDeadline(t)
}

// xchg is ctx_xchg_data: this side's message out, the peer's n bytes in, the client
// writing first.
func (p *ptConn) xchg(mine []byte, n int) ([]byte, error) {
	var theirs []byte
	var err error
	if !p.client {
		if theirs, err = p.read(n); err != nil {
			return nil, err
		}
	}
	if err := p.write(mine); err != nil {
		return nil, err
	}
	if p.client {
		if theirs, err = p.read(n); err != nil {
			return nil, err
		}
	}
	return theirs, nil
}

// ptParams are what the first steps settle: the cycle buffer, the cache line size and
// the path MTU both sides use.
type ptParams struct {
	Cycle, CacheLine int
	MTU              verbs.MTU
}

// prefix runs the steps before the first handshake (exchange_versions,
// check_version_compatibility, check_sys_data, check_mtu) with this side's values and
// returns what both sides settle on.
func (p *ptConn) prefix(own ptParams) (ptParams, error) {
	rem, err := p.xchg(versionMessage(ptVersion), ptVersionLen)
	if err != nil {
		return ptParams{}, err
	}
	p.remVerStr = string(bytes.TrimRight(rem, "\x00"))
	p.remVersion = atof(rem)
	if rem[0] == '{' {
		return ptParams{}, errors.New("the peer speaks rperf's own protocol: give the client --perftest too, or the server no --perftest")
	}
	if p.remVersion < ptMinVersion {
		return ptParams{}, fmt.Errorf("perftest peer reports version %q: perftest (and rperf's perftest mode, which speaks version %s) works only with versions from %.2f on", p.remVerStr, ptVersion, ptMinVersion)
	}
	got := own
	if p.remVersion >= 5.32 {
		for _, v := range []*int{&got.Cycle, &got.CacheLine} {
			b, err := p.xchg(binary.BigEndian.AppendUint32(nil, uint32(*v)), 4)
			if err != nil {
				return ptParams{}, err
			}
			*v = max(*v, int(int32(binary.BigEndian.Uint32(b))))
		}
	}
	if p.remVersion >= 5.1 {
		n := ptMTULen
		if p.remVersion < 5.31 {
			n = 4
		}
		b, err := p.xchg(mtuMessage(own.MTU, n), n)
		if err != nil {
			return ptParams{}, err
		}
		if m := parseMTUMessage(b); m != 0 && m < got.MTU {
			got.MTU = m
		}
	}
	return got, nil
}

// handshake is ctx_hand_shake: this side's destination out, the peer's in (over TCP as
// text, over rdma_cm as perftest's struct).
func (p *ptConn) handshake(d ptDest) (ptDest, error) {
	if p.rc != nil {
		b, err := p.xchg(d.marshalBinary(), ptDestBinLen)
		if err != nil {
			return ptDest{}, err
		}
		return parsePtDestBinary(b)
	}
	b, err := p.xchg(d.marshal(), ptDestLen)
	if err != nil {
		return ptDest{}, err
	}
	return parsePtDest(b)
}

// reports is xchg_bw_reports: this side's report out, the peer's in.
func (p *ptConn) reports(mine ptReport) (ptReport, error) {
	var theirs ptReport
	itersLen := 8
	if p.remVersion < 5.33 {
		itersLen = 4
	}
	steps := []struct {
		out []byte
		n   int
		in  func([]byte)
	}{
		{binary.BigEndian.AppendUint64(nil, mine.Size), 8, func(b []byte) { theirs.Size = binary.BigEndian.Uint64(b) }},
		{iterBytes(mine.Iters, itersLen), itersLen, func(b []byte) {
			if len(b) == 4 {
				theirs.Iters = uint64(binary.BigEndian.Uint32(b))
			} else {
				theirs.Iters = binary.BigEndian.Uint64(b)
			}
		}},
		{binary.BigEndian.AppendUint64(nil, math.Float64bits(mine.Peak)), 8, func(b []byte) { theirs.Peak = math.Float64frombits(binary.BigEndian.Uint64(b)) }},
		{binary.BigEndian.AppendUint64(nil, math.Float64bits(mine.Avg)), 8, func(b []byte) { theirs.Avg = math.Float64frombits(binary.BigEndian.Uint64(b)) }},
		{binary.BigEndian.AppendUint64(nil, math.Float64bits(mine.MsgRate)), 8, func(b []byte) { theirs.MsgRate = math.Float64frombits(binary.BigEndian.Uint64(b)) }},
	}
	for _, s := range steps {
		b, err := p.xchg(s.out, s.n)
		if err != nil {
			return ptReport{}, err
		}
		s.in(b)
	}
	return theirs, nil
}

func iterBytes(v uint64, n int) []byte {
	if n == 4 {
		return binary.BigEndian.AppendUint32(nil, uint32(v))
	}
	return binary.BigEndian.AppendUint64(nil, v)
}

// close is ctx_close_connection: a last handshake, then "done" from each side over TCP
// (over rdma_cm the handshake alone). perftest 4.5 writes its "done" and closes without
// reading ours (later releases write none); this side reads the peer's, so as not to
// close with unread data, which would answer the peer's late "done" with a reset, and
// ignores failures after the handshake.
func (p *ptConn) close(d ptDest) error {
	if p.rc != nil {
		_, err := p.handshake(d) // the server's SEND is the last message (see ptComm.send)
		return err
	}
	if _, err := p.handshake(d); err != nil {
		return err
	}
	_, _ = p.conn.Write(ptDone)
	var b [len("done\x00")]byte
	_ = p.conn.SetReadDeadline(time.Now().Add(ptDoneWait))
	_, _ = io.ReadFull(p.r, b[:])
	return nil
}

package main

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/softrnic/softrnic/verbs"
)

// The TCP exchange of rdma-core's ibv_rc_pingpong and ibv_ud_pingpong: each side sends
// "LID:QPN:PSN:GID" as lowercase hex ("%04x:%06x:%06x:" and the GID's 16 bytes as 32 hex
// digits, in memory order) in a fixed 52-byte message, NUL included. The client writes
// its message first and reads the server's; the server connects its QP before it
// answers; the client ends with "done" and its NUL.

// msgLen is sizeof "0000:000000:000000:00000000000000000000000000000000".
const msgLen = 52

// doneMsg is what the client writes last (sizeof "done": the NUL included).
var doneMsg = []byte("done\x00")

// dest is one side's address: pingpong.c's struct pingpong_dest.
type dest struct {
	LID uint16
	QPN uint32
	PSN uint32
	GID verbs.GID
}

// marshal formats d as the 52-byte message.
func (d dest) marshal() []byte {
	b := make([]byte, 0, msgLen)
	b = fmt.Appendf(b, "%04x:%06x:%06x:", d.LID, d.QPN&0xFFFFFF, d.PSN&0xFFFFFF)
	b = hex.AppendEncode(b, d.GID[:])
	return append(b, 0)
}

// parseDest reads a 52-byte message as the C tools' sscanf("%x:%x:%x:%s") does, but
// strictly: three hex numbers and a GID of 32 hex digits, then NUL padding.
func parseDest(msg []byte) (dest, error) {
	var d dest
	if i := bytes.IndexByte(msg, 0); i >= 0 {
		msg = msg[:i]
	}
	f := bytes.Split(msg, []byte(":"))
	if len(f) != 4 {
		return d, fmt.Errorf("peer's address %q: want LID:QPN:PSN:GID", msg)
	}
	var nums [3]uint64
	for i, bits := range []int{16, 24, 24} {
		v, err := strconv.ParseUint(string(f[i]), 16, bits)
		if err != nil {
			return d, fmt.Errorf("peer's address %q: field %d: %v", msg, i+1, err)
		}
		nums[i] = v
	}
	if len(f[3]) != 2*len(d.GID) {
		return d, fmt.Errorf("peer's address %q: GID of %d hex digits, want 32", msg, len(f[3]))
	}
	if _, err := hex.Decode(d.GID[:], f[3]); err != nil {
		return d, fmt.Errorf("peer's address %q: GID: %v", msg, err)
	}
	d.LID, d.QPN, d.PSN = uint16(nums[0]), uint32(nums[1]), uint32(nums[2])
	return d, nil
}

// gidString formats a GID as inet_ntop(AF_INET6) does ("::ffff:10.77.0.1", "::").
func gidString(g verbs.GID) string { return netip.AddrFrom16(g).String() }

// exchangeTimeout bounds each read and write of the exchange once connected (the C tools
// have none; a peer that connects and says nothing would otherwise hold us for ever).
const exchangeTimeout = 60 * time.Second

// clientExchange is pp_client_exch_dest: write ours, read theirs, write "done".
func clientExchange(conn net.Conn, my dest) (dest, error) {
	_ = conn.SetDeadline(time.Now().Add(exchangeTimeout))
	if _, err := conn.Write(my.marshal()); err != nil {
		return dest{}, fmt.Errorf("couldn't send local address: %w", err)
	}
	msg := make([]byte, msgLen)
	if _, err := io.ReadFull(conn, msg); err != nil {
		return dest{}, fmt.Errorf("couldn't read remote address: %w", err)
	}
	rem, err := parseDest(msg)
	if err != nil {
		return dest{}, err
	}
	if _, err := conn.Write(doneMsg); err != nil {
		return dest{}, fmt.Errorf("couldn't write done: %w", err)
	}
	return rem, nil
}

// serverRead is the first half of pp_server_exch_dest: read the client's address.
func serverRead(conn net.Conn) (dest, error) {
	_ = conn.SetDeadline(time.Now().Add(exchangeTimeout))
	msg := make([]byte, msgLen)
	if n, err := io.ReadFull(conn, msg); err != nil {
		return dest{}, fmt.Errorf("%d/%d: couldn't read remote address: %w", n, msgLen, err)
	}
	return parseDest(msg)
}

// serverAnswer is its second half, after the QP was connected: write ours, read "done".
func serverAnswer(conn net.Conn, my dest) error {
	_ = conn.SetDeadline(time.Now().Add(exchangeTimeout))
	if _, err := conn.Write(my.marshal()); err != nil {
		return fmt.Errorf("couldn't send local address: %w", err)
	}
	done := make([]byte, len(doneMsg))
	if _, err := io.ReadFull(conn, done); err != nil {
		return fmt.Errorf("couldn't read done: %w", err)
	}
	if !bytes.Equal(done, doneMsg) {
		return fmt.Errorf("peer ended the exchange with %q, want \"done\"", done)
	}
	return nil
}

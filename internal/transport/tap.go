package transport

import (
	"net/netip"
	"time"

	"github.com/softrnic/softrnic/internal/pcap"
)

// tap writes what the device's link carries to a pcap file, as ibdump or tcpdump on an
// rxe interface would show it: each RoCE packet in its own IP datagram, with the IPv4
// identification it has on the wire. Sent packets are taken from netio after GSO
// grouping (segment i of a GSO send has identification i); received ones after their
// ICRC gave their identification away (0 for one whose ICRC fails). With no writer the
// device never calls it.
type tap struct {
	w     *pcap.Writer
	local netip.AddrPort
}

func (t *tap) sent(src, dst netip.AddrPort, id uint16, pieces [][]byte) {
	t.w.WriteUDP(time.Now(), &pcap.Datagram{Src: src, Dst: dst, ID: id, DF: true}, pieces...)
}

func (t *tap) received(from netip.AddrPort, id uint16, pkt []byte) {
	t.w.WriteUDP(time.Now(), &pcap.Datagram{Src: from, Dst: t.local, ID: id, DF: true}, pkt)
}

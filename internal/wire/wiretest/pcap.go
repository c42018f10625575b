package wiretest

import (
	"encoding/binary"
	"io"
	"net/netip"
)

// Frame wraps a RoCEv2 packet (BTH to ICRC) in Ethernet, IPv4 and UDP headers from src to
// dst, as a capture on a link would show it: IPv4 with DF set and identification 0 (what
// softrnic's ICRC assumes), TTL 64, a correct header checksum, UDP checksum 0.
func Frame(src, dst netip.AddrPort, roce []byte) []byte {
	f := make([]byte, 14+20+8, 14+20+8+len(roce))
	binary.BigEndian.PutUint16(f[12:], 0x0800)
	ip := f[14:34]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+8+len(roce)))
	ip[6] = 0x40
	ip[8], ip[9] = 64, 17
	s, d := src.Addr().Unmap().As4(), dst.Addr().Unmap().As4()
	copy(ip[12:16], s[:])
	copy(ip[16:20], d[:])
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	for sum > 0xFFFF {
		sum = sum&0xFFFF + sum>>16
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
	udp := f[34:42]
	binary.BigEndian.PutUint16(udp[0:], src.Port())
	binary.BigEndian.PutUint16(udp[2:], dst.Port())
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(roce)))
	return append(f, roce...)
}

// WritePCAP writes frames as a classic pcap file (Ethernet link type) for tshark.
func WritePCAP(w io.Writer, frames [][]byte) error {
	var h [24]byte
	binary.LittleEndian.PutUint32(h[0:], 0xa1b2c3d4)
	binary.LittleEndian.PutUint16(h[4:], 2)
	binary.LittleEndian.PutUint16(h[6:], 4)
	binary.LittleEndian.PutUint32(h[16:], 65535)
	binary.LittleEndian.PutUint32(h[20:], 1) // LINKTYPE_ETHERNET
	if _, err := w.Write(h[:]); err != nil {
		return err
	}
	for i, f := range frames {
		var r [16]byte
		binary.LittleEndian.PutUint32(r[0:], uint32(i+1)) // seconds: one frame a second
		binary.LittleEndian.PutUint32(r[8:], uint32(len(f)))
		binary.LittleEndian.PutUint32(r[12:], uint32(len(f)))
		if _, err := w.Write(r[:]); err != nil {
			return err
		}
		if _, err := w.Write(f); err != nil {
			return err
		}
	}
	return nil
}

package interop

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"sort"
	"strings"

	"github.com/softrnic/softrnic/internal/mad"
	"github.com/softrnic/softrnic/internal/pcap"
	"github.com/softrnic/softrnic/internal/wire"
)

// WireReport is what a capture of a link shows of its RoCEv2 traffic: packets by
// direction and kind (opcode, or CM message for MADs), and every packet whose ICRC does
// not verify, computed over the IP header as captured (so rxe's non-zero IPv4
// identifications are covered).
type WireReport struct {
	Packets  int
	ByKind   map[string]int // "10.77.1.1->10.77.1.2 RC_SEND_ONLY": count
	BadICRC  []string       // one line per bad packet
	NotRoCE  int            // UDP to 4791 too short for a BTH and ICRC
	DstPorts map[uint16]int // RoCEv2 packets by UDP destination port (all must be 4791)
}

// CheckCapture reads a pcap file of link type Ethernet (tcpdump on a bridge or tap) or
// raw IP, and checks every UDP datagram to or from port 4791.
func CheckCapture(path string) (*WireReport, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	recs, link, err := pcap.ReadAll(f)
	if err != nil {
		return nil, err
	}
	r := &WireReport{ByKind: map[string]int{}, DstPorts: map[uint16]int{}}
	for i, rec := range recs {
		ip := rec.Data
		switch link {
		case 1: // Ethernet
			if len(ip) < 14 || binary.BigEndian.Uint16(ip[12:]) != 0x0800 {
				continue
			}
			ip = ip[14:]
		case 101, 228: // raw IP, IPv4
		default:
			return nil, fmt.Errorf("%s: link type %d (want Ethernet or raw IPv4)", path, link)
		}
		r.check(i, ip)
	}
	return r, nil
}

func (r *WireReport) check(i int, ip []byte) {
	if len(ip) < 20 || ip[0]>>4 != 4 || ip[9] != 17 {
		return
	}
	ihl := int(ip[0]&0xF) * 4
	total := int(binary.BigEndian.Uint16(ip[2:]))
	if ihl < 20 || total > len(ip) || total < ihl+8 {
		return
	}
	udp := ip[ihl:total]
	sport, dport := binary.BigEndian.Uint16(udp), binary.BigEndian.Uint16(udp[2:])
	if sport != wire.UDPPort && dport != wire.UDPPort {
		return
	}
	pkt := udp[8:]
	if len(pkt) < wire.BTHLen+wire.ICRCLen {
		r.NotRoCE++
		return
	}
	r.Packets++
	r.DstPorts[dport]++
	src, _ := netip.AddrFromSlice(ip[12:16])
	dst, _ := netip.AddrFromSlice(ip[16:20])
	flow := wire.Flow{Src: src, Dst: dst, SrcPort: sport, DstPort: dport,
		IPID: binary.BigEndian.Uint16(ip[4:]), DF: ip[6]&0x40 != 0}
	kind := opcodeName(pkt[0])
	if pkt[0] == 0x64 && len(pkt) >= wire.BTHLen+8+mad.Size { // UD SEND_ONLY: a MAD to QP1?
		if qp := binary.BigEndian.Uint32(pkt[4:]) & 0xFFFFFF; qp == 1 {
			if h, err := mad.DecodeHeader(pkt[wire.BTHLen+8 : wire.BTHLen+8+mad.Size]); err == nil {
				kind = "MAD " + h.AttrID.String()
			}
		}
	}
	r.ByKind[fmt.Sprintf("%v->%v %s", src, dst, kind)]++
	if !flow.VerifyICRC(pkt) {
		r.BadICRC = append(r.BadICRC, fmt.Sprintf("packet %d %v:%d->%v:%d %s id %d: bad ICRC", i+1, src, sport, dst, dport, kind, flow.IPID))
	}
}

// Count is the number of RoCEv2 packets from src to dst.
func (r *WireReport) Count(src, dst netip.Addr) int {
	n := 0
	prefix := fmt.Sprintf("%v->%v ", src, dst)
	for k, v := range r.ByKind {
		if strings.HasPrefix(k, prefix) {
			n += v
		}
	}
	return n
}

// String lists the packets by kind, one line each.
func (r *WireReport) String() string {
	keys := make([]string, 0, len(r.ByKind))
	for k := range r.ByKind {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	fmt.Fprintf(&b, "%d RoCEv2 packets, %d with a bad ICRC", r.Packets, len(r.BadICRC))
	for _, k := range keys {
		fmt.Fprintf(&b, "\n  %6d %s", r.ByKind[k], k)
	}
	return b.String()
}

// Err is nil when every packet's ICRC verified and every one went to port 4791.
func (r *WireReport) Err() error {
	var errs []string
	if len(r.BadICRC) > 0 {
		errs = append(errs, fmt.Sprintf("%d packets with a bad ICRC (first: %s)", len(r.BadICRC), r.BadICRC[0]))
	}
	for p, n := range r.DstPorts {
		if p != wire.UDPPort {
			errs = append(errs, fmt.Sprintf("%d packets to UDP port %d (RoCEv2 packets go to %d)", n, p, wire.UDPPort))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%s", strings.Join(errs, "; "))
}

var opcodeNames = map[uint8]string{
	0x00: "RC_SEND_FIRST", 0x01: "RC_SEND_MIDDLE", 0x02: "RC_SEND_LAST", 0x03: "RC_SEND_LAST_IMM",
	0x04: "RC_SEND_ONLY", 0x05: "RC_SEND_ONLY_IMM", 0x06: "RC_WRITE_FIRST", 0x07: "RC_WRITE_MIDDLE",
	0x08: "RC_WRITE_LAST", 0x09: "RC_WRITE_LAST_IMM", 0x0A: "RC_WRITE_ONLY", 0x0B: "RC_WRITE_ONLY_IMM",
	0x0C: "RC_READ_REQUEST", 0x0D: "RC_READ_RESPONSE_FIRST", 0x0E: "RC_READ_RESPONSE_MIDDLE",
	0x0F: "RC_READ_RESPONSE_LAST", 0x10: "RC_READ_RESPONSE_ONLY", 0x11: "RC_ACKNOWLEDGE",
	0x12: "RC_ATOMIC_ACKNOWLEDGE", 0x13: "RC_COMPARE_SWAP", 0x14: "RC_FETCH_ADD",
	0x16: "RC_SEND_LAST_INV", 0x17: "RC_SEND_ONLY_INV",
	0x64: "UD_SEND_ONLY", 0x65: "UD_SEND_ONLY_IMM",
}

func opcodeName(op uint8) string {
	if n, ok := opcodeNames[op]; ok {
		return n
	}
	return fmt.Sprintf("opcode %#02x", op)
}

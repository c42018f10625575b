// Package cmtool holds what softrnic's counterparts of librdmacm's example programs
// (cmd/rping, cmd/ucmatose, cmd/udaddy) share: getopt-style command lines with the flags
// softrnic adds to every tool (--dev-addr, --udp-port, --pcap, --json, --stats,
// --timeout), the choice and opening of the local device, the exit status of a bad
// command line and the context of a run (also cmd/pingpong's), the output a run writes
// from several goroutines, the completion loop of a CQ with a completion channel, and the
// counters each tool reports after a run.
package cmtool

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"reflect"
	"sort"
	"strings"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/verbs"
)

// ExpandArgs rewrites a command line the way getopt(3) reads it into one Go's flag
// package reads: a cluster of one-letter boolean flags ("-vVd") becomes one argument
// each, and a one-letter flag that takes a value may carry it attached ("-C10",
// "-a10.0.0.1"). Whether a flag takes a value is what fs says. Arguments after "--", and
// the value that follows a flag written alone, are left as they are.
func ExpandArgs(fs *flag.FlagSet, args []string) []string {
	isBool := func(name string) (known, boolean bool) {
		f := fs.Lookup(name)
		if f == nil {
			return false, false
		}
		b, ok := f.Value.(interface{ IsBoolFlag() bool })
		return true, ok && b.IsBoolFlag()
	}
	var out []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...)
		}
		if len(a) < 2 || a[0] != '-' {
			out = append(out, a)
			continue
		}
		name := strings.TrimLeft(a, "-")
		if strings.Contains(name, "=") {
			out = append(out, a)
			continue
		}
		if known, b := isBool(name); known {
			out = append(out, a)
			if !b && i+1 < len(args) {
				i++
				out = append(out, args[i]) // its value, whatever it looks like
			}
			continue
		}
		if strings.HasPrefix(a, "--") {
			out = append(out, a) // unknown: flag reports it
			continue
		}
		// A single dash and an unknown name: a cluster of letters.
		var split []string
		ok := true
		for j := 0; j < len(name); j++ {
			known, b := isBool(name[j : j+1])
			if !known {
				ok = false
				break
			}
			split = append(split, "-"+name[j:j+1])
			if !b {
				if rest := name[j+1:]; rest != "" {
					split = append(split, rest)
				} else if i+1 < len(args) {
					i++
					split = append(split, args[i])
				}
				break
			}
		}
		if !ok {
			out = append(out, a) // flag reports it
			continue
		}
		out = append(out, split...)
	}
	return out
}

// LocalAddrFor returns the address this host sends from to reach dst, as
// rdma_resolve_addr picks the local device from the route (no packet is sent).
func LocalAddrFor(dst netip.Addr) (netip.Addr, error) {
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, 4791)))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("no route to %v: %w", dst, err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap(), nil
}

// ResolveAddr parses an IP address or resolves a host name (the first IPv4 address, else
// the first one), as the C tools' getaddrinfo does.
func ResolveAddr(s string) (netip.Addr, error) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap(), nil
	}
	ips, err := net.DefaultResolver.LookupNetIP(context.Background(), "ip", s)
	if err != nil {
		return netip.Addr{}, err
	}
	if len(ips) == 0 {
		return netip.Addr{}, fmt.Errorf("%s: no address", s)
	}
	for _, a := range ips {
		if a.Unmap().Is4() {
			return a.Unmap(), nil
		}
	}
	return ips[0], nil
}

// Waiter hands out the completions of one CQ one at a time, sleeping on the CQ's
// completion channel when there are none: the arm-then-drain loop of rping's cq_thread
// (ibv_get_cq_event, ibv_req_notify_cq, ibv_poll_cq, ibv_ack_cq_events).
type Waiter struct {
	cq    *verbs.CQ
	ch    *verbs.CompChannel
	buf   [16]verbs.WorkCompletion
	n, i  int
	armed bool
}

// NewWaiter returns a Waiter for cq, whose events go to its completion channel.
func NewWaiter(cq *verbs.CQ) *Waiter { return &Waiter{cq: cq, ch: cq.Channel()} }

// Next returns the next completion, waiting until one comes or ctx is done.
func (w *Waiter) Next(ctx context.Context) (verbs.WorkCompletion, error) {
	for {
		if w.i < w.n {
			w.i++
			return w.buf[w.i-1], nil
		}
		if w.n, w.i = w.cq.PollCQ(w.buf[:]), 0; w.n > 0 {
			continue
		}
		if !w.armed {
			if err := w.cq.ReqNotifyCQ(false); err != nil {
				return verbs.WorkCompletion{}, err
			}
			w.armed = true
			continue // poll again: a completion may have come before the arm
		}
		cq, err := w.ch.GetCQEvent(ctx)
		if err != nil {
			return verbs.WorkCompletion{}, err
		}
		cq.AckCQEvents(1)
		w.armed = false
	}
}

// errorFields are the device counters that count something no correct peer causes, even
// over a lossy path: packets with a bad ICRC, malformed or for no QP, from a source
// other than the QP's peer, of the other ordering mode, with a wrong Q_Key or beyond the
// arrival bitmap, and datagrams the kernel refused to send.
var errorFields = []string{"WrongSource", "WrongMode", "QKeyErrors", "BeyondSpan", "ICRCErrors", "Malformed", "UnknownQP", "SendErrors"}

// lossFields are the counters that loss, reordering or a slow peer explain: NAKs (a PSN
// sequence error), packets out of sequence, duplicates, retransmissions and local ACK
// timeouts. Under emulation (rxe in a TCG guest) they are expected.
var lossFields = []string{"NAKsSent", "NAKsReceived", "OutOfSequence", "Duplicates", "Retransmits", "Timeouts"}

func pick(dev verbs.Counters, fields []string, m map[string]uint64) map[string]uint64 {
	dv := reflect.ValueOf(dev)
	for _, f := range fields {
		if v := dv.FieldByName(f).Uint(); v != 0 {
			if m == nil {
				m = map[string]uint64{}
			}
			m["device."+f] = v
		}
	}
	return m
}

// Errors returns the error counters of a device and its connection manager that are not
// zero (nil if none), named "device.X" and "cm.X": errorFields, the MADs the connection
// manager dropped (malformed, or matching no connection), could not send, or dropped for
// a full backlog. Left out: what loss explains (Loss), and the device's Dropped, which
// counts a packet that arrives after its QP went to ERR at a disconnect (the peer's last
// ACK, overtaken by its DisconnectRequest).
func Errors(dev verbs.Counters, s cm.Counters) map[string]uint64 {
	m := pick(dev, errorFields, nil)
	for _, c := range []struct {
		k string
		v uint64
	}{{"cm.Dropped", s.Dropped}, {"cm.SendErrors", s.SendErrors}, {"cm.BacklogDrops", s.BacklogDrops}} {
		if c.v != 0 {
			if m == nil {
				m = map[string]uint64{}
			}
			m[c.k] = c.v
		}
	}
	return m
}

// Loss returns the counters of a device and its connection manager that loss on the path
// explains and that are not zero (nil if none): lossFields, and the connection manager's
// resent REQs, REPs and DREQs.
func Loss(dev verbs.Counters, s cm.Counters) map[string]uint64 {
	m := pick(dev, lossFields, nil)
	for _, c := range []struct {
		k string
		v uint64
	}{{"cm.REQRetries", s.REQRetries}, {"cm.REPRetries", s.REPRetries}, {"cm.DREQRetries", s.DREQRetries}} {
		if c.v != 0 {
			if m == nil {
				m = map[string]uint64{}
			}
			m[c.k] = c.v
		}
	}
	return m
}

// NonZero formats the non-zero counters of a struct of uint64 fields (verbs.Counters,
// cm.Counters) as "Name=value" words, in field order.
func NonZero(v any) string {
	rv := reflect.ValueOf(v)
	var w []string
	for i := 0; i < rv.NumField(); i++ {
		f := rv.Field(i)
		if f.Kind() == reflect.Uint64 && f.Uint() != 0 {
			w = append(w, fmt.Sprintf("%s=%d", rv.Type().Field(i).Name, f.Uint()))
		}
	}
	if len(w) == 0 {
		return "(all zero)"
	}
	return strings.Join(w, " ")
}

// ErrorsLine formats the result of Errors or Loss ("none" if empty).
func ErrorsLine(m map[string]uint64) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var w []string
	for _, k := range keys {
		w = append(w, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return strings.Join(w, " ")
}

// Counters are what a tool reports about its device after a run: the device's packet
// counters (without the per-queue breakdown), its connection manager's, and of these the
// error counters and the signs of loss that are not zero.
type Counters struct {
	Device verbs.Counters    `json:"device"`
	CM     cm.Counters       `json:"cm"`
	Errors map[string]uint64 `json:"errors,omitempty"`
	Loss   map[string]uint64 `json:"loss,omitempty"`
}

// Read reads dev's counters.
func Read(dev *verbs.Device) Counters {
	c := Counters{Device: dev.Counters(), CM: cm.DeviceCounters(dev)}
	c.Device.Queues = nil
	c.Errors = Errors(c.Device, c.CM)
	c.Loss = Loss(c.Device, c.CM)
	return c
}

// Lines formats c as four lines with a prefix each.
func (c Counters) Lines(prefix string) string {
	return fmt.Sprintf("%sdevice: %s\n%scm:     %s\n%serrors: %s\n%sloss:   %s\n",
		prefix, NonZero(c.Device), prefix, NonZero(c.CM), prefix, ErrorsLine(c.Errors), prefix, ErrorsLine(c.Loss))
}

// RDMACMAckTimeout is the local ACK timeout code a QP connected through Linux's rdma_cm
// over RoCE gets when the application sets none: the Primary Local ACK Timeout of the
// kernel's REQ, CMA_IBOE_PACKET_LIFETIME (18 in the 6.1 kernel of rxevm's guest) + 1,
// 4.096 µs × 2^19 = 2.1 s (verbs' default, 14, is 67 ms). The tools use it so that their
// QPs time out as the C tools' do: against rxe in an emulated guest, whose ACKs can take
// longer than 67 ms under load, the shorter timeout retransmits early and exhausts
// cmatose's 5 retries.
const RDMACMAckTimeout = 19

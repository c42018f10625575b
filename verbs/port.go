package verbs

import (
	"fmt"
	"net"
	"net/netip"
)

// PortState is a port's logical state (ibv_port_state). A software device's port is active
// while the device is open.
type PortState int

// Port states.
const (
	PortDown   PortState = 1
	PortActive PortState = 4
)

func (s PortState) String() string {
	switch s {
	case PortDown:
		return "PORT_DOWN"
	case PortActive:
		return "PORT_ACTIVE"
	}
	return fmt.Sprintf("PortState(%d)", int(s))
}

// PortAttr are a port's attributes (ibv_port_attr), as ibv_query_port reports them.
type PortAttr struct {
	State PortState
	// MaxMTU is the largest path MTU the device supports (4096); ActiveMTU the largest
	// the link carries: what path MTUs of the port's QPs may be at most, and a UD
	// message's size limit.
	MaxMTU, ActiveMTU MTU
	GIDTblLen         int
	// LinkLayer is "Ethernet": RoCE.
	LinkLayer string
	// LinkMTU is the IP MTU of the interface the device's address is on (0 if the
	// address is on none, e.g. unspecified), and Interface its name; not in libibverbs.
	LinkMTU   int
	Interface string
}

// QueryPort returns the attributes of port (the device has one port, 1).
func (c *Device) QueryPort(port uint8) (PortAttr, error) {
	if port != 1 {
		return PortAttr{}, fmt.Errorf("verbs: QueryPort: %w: port %d (the device has port 1)", ErrInvalid, port)
	}
	a := c.port
	if c.isClosed() {
		a.State = PortDown
	}
	return a, nil
}

// rxeHeaderRoom is what a RoCEv2 packet adds to its payload at most (IP, UDP, BTH, the
// largest extension headers, ICRC), the room Linux rxe leaves when it derives a port's
// active MTU from its interface's MTU: 1500 gives 1024, 9000 gives 4096.
const rxeHeaderRoom = 80

// activeMTU is the largest path MTU whose packets fit a link of IP MTU linkMTU, as rxe
// derives it (at least 256; at most 4096).
func activeMTU(linkMTU int) MTU {
	payload := linkMTU - rxeHeaderRoom
	for m := MTU4096; m > MTU256; m-- {
		if m.Bytes() <= payload {
			return m
		}
	}
	return MTU256
}

// linkOf returns the interface that holds addr and its MTU, or "" and 0 if none does
// (an unspecified address, or a system that does not list interfaces).
func linkOf(addr netip.Addr) (string, int) {
	if !addr.IsValid() || addr.IsUnspecified() {
		return "", 0
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return "", 0
	}
	for _, ifc := range ifs {
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			n, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap() == addr {
				return ifc.Name, ifc.MTU
			}
		}
	}
	// 127.0.0.0/8 is all on the loopback interface, though only 127.0.0.1 is listed.
	if addr.Is4() && addr.IsLoopback() {
		for _, ifc := range ifs {
			if ifc.Flags&net.FlagLoopback != 0 {
				return ifc.Name, ifc.MTU
			}
		}
	}
	return "", 0
}

// portAttr is the port of a device at addr, whose MTU is the link's as rxe has it, or
// 4096 where the address is on no interface listed.
func portAttr(addr netip.Addr) PortAttr {
	a := PortAttr{State: PortActive, MaxMTU: MTU4096, ActiveMTU: MTU4096, GIDTblLen: 1, LinkLayer: "Ethernet"}
	if name, mtu := linkOf(addr); mtu > 0 {
		a.Interface, a.LinkMTU, a.ActiveMTU = name, mtu, activeMTU(mtu)
	}
	return a
}

// checkPathMTU refuses a path MTU above the port's active MTU: its packets would not fit
// the link.
func (c *Device) checkPathMTU(m MTU) error {
	if m <= c.port.ActiveMTU {
		return nil
	}
	if c.port.LinkMTU > 0 {
		return fmt.Errorf("%w: path MTU %d is above the port's active MTU %d (link MTU %d on %s)",
			ErrInvalid, m.Bytes(), c.port.ActiveMTU.Bytes(), c.port.LinkMTU, c.port.Interface)
	}
	return fmt.Errorf("%w: path MTU %d is above the port's active MTU %d", ErrInvalid, m.Bytes(), c.port.ActiveMTU.Bytes())
}

// ActiveMTUFor returns the active MTU that a device opened at addr would report (see
// PortAttr): for tools that announce an MTU before they open the device, as perftest's
// exchange does.
func ActiveMTUFor(addr netip.Addr) MTU { return portAttr(addr.Unmap()).ActiveMTU }

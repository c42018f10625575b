package verbs

import (
	"fmt"
	"net/netip"
	"sync/atomic"

	"github.com/softrnic/softrnic/internal/transport"
)

// AH is an address handle (ibv_ah): where a UD QP's datagrams to one peer device go.
type AH struct {
	pd   *PD
	ah   *transport.AH
	attr AHAttr
	dead atomic.Bool
}

// CreateAH creates an address handle for attr's destination GID and UDP port
// (ibv_create_ah). The GID is the peer device's IP address (an IPv4-mapped GID for IPv4).
func (pd *PD) CreateAH(attr *AHAttr) (*AH, error) {
	if attr == nil {
		return nil, fmt.Errorf("verbs: CreateAH: %w: nil attributes", ErrInvalid)
	}
	if attr.DGID.IsZero() {
		return nil, fmt.Errorf("verbs: CreateAH: %w: no destination GID", ErrInvalid)
	}
	port := attr.DestPort
	if port == 0 {
		port = DefaultPort
	}
	c := pd.ctx
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := pd.use(); err != nil {
		return nil, fmt.Errorf("verbs: CreateAH: %w", err)
	}
	ta, err := c.dev.NewAH(netip.AddrPortFrom(attr.DGID.Addr(), port))
	if err != nil {
		pd.users--
		return nil, fmt.Errorf("verbs: CreateAH: %w: %v", ErrInvalid, err)
	}
	a := *attr
	a.DestPort = port
	return &AH{pd: pd, ah: ta, attr: a}, nil
}

// Attr returns the attributes the handle was created with.
func (a *AH) Attr() AHAttr { return a.attr }

// DestroyAH destroys the handle (ibv_destroy_ah). Work requests already posted with it
// still go out; posting with it afterwards fails.
func (a *AH) DestroyAH() error {
	c := a.pd.ctx
	c.mu.Lock()
	defer c.mu.Unlock()
	if a.dead.Swap(true) {
		return fmt.Errorf("verbs: DestroyAH: %w", ErrClosed)
	}
	a.pd.users--
	return nil
}

// use returns the engine's handle for a post on a QP of pd (no lock: posting stays
// lock-free).
func (a *AH) use(pd *PD) (*transport.AH, error) {
	switch {
	case a.dead.Load():
		return nil, fmt.Errorf("address handle was destroyed: %w", ErrClosed)
	case a.pd != pd:
		return nil, fmt.Errorf("%w: the address handle belongs to another protection domain", ErrInvalid)
	}
	return a.ah, nil
}

// GRHLen is the size of the GRH area at the start of every UD receive buffer (the
// completion's WCGRH flag says it is there; ByteLen includes it).
const GRHLen = transport.GRHLen

// ParseGRH returns the source GID of a received datagram from the GRH area at the start
// of its receive buffer (for RoCEv2 over IPv4 the area holds the IPv4 header in its last
// 20 bytes; over IPv6, the IPv6 header).
func ParseGRH(grh []byte) (src GID, ok bool) {
	a, ok := transport.GRHSource(grh)
	if !ok {
		return GID{}, false
	}
	return GIDFromAddr(a), true
}

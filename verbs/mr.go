package verbs

import (
	"fmt"
	"unsafe"

	"github.com/softrnic/softrnic/internal/pages"
	"github.com/softrnic/softrnic/internal/tpt"
)

// PD is a protection domain (ibv_pd): memory regions and QPs of one PD can only be used
// together.
type PD struct {
	ctx   *Device
	id    uint32
	users int // MRs, QPs and SRQs allocated from it (guarded by ctx.mu)
	dead  bool
}

// AllocPD allocates a protection domain.
func (c *Device) AllocPD() (*PD, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.check(); err != nil {
		return nil, fmt.Errorf("verbs: AllocPD: %w", err)
	}
	if c.pds >= maxPD {
		return nil, fmt.Errorf("verbs: AllocPD: %w (max_pd %d)", ErrLimit, maxPD)
	}
	pd := &PD{ctx: c, id: c.nextPD}
	c.nextPD++
	c.pds++
	return pd, nil
}

// DeallocPD frees the protection domain; it fails while MRs, QPs or SRQs use it.
func (pd *PD) DeallocPD() error {
	c := pd.ctx
	c.mu.Lock()
	defer c.mu.Unlock()
	if pd.dead {
		return fmt.Errorf("verbs: DeallocPD: %w", ErrClosed)
	}
	if pd.users > 0 {
		return fmt.Errorf("verbs: DeallocPD: %w: %d MRs, QPs or SRQs still use the PD", ErrBusy, pd.users)
	}
	pd.dead = true
	c.pds--
	return nil
}

// Device returns the device the PD belongs to.
func (pd *PD) Device() *Device { return pd.ctx }

func (pd *PD) use() error {
	c := pd.ctx
	if err := c.check(); err != nil {
		return err
	}
	if pd.dead {
		return fmt.Errorf("protection domain was deallocated: %w", ErrClosed)
	}
	pd.users++
	return nil
}

// AccessFlags are memory and QP access rights (ibv_access_flags values).
type AccessFlags uint32

// Access rights.
const (
	AccessLocalWrite   AccessFlags = 1
	AccessRemoteWrite  AccessFlags = 2
	AccessRemoteRead   AccessFlags = 4
	AccessRemoteAtomic AccessFlags = 8
	// AccessOnDemand (IBV_ACCESS_ON_DEMAND) registers without faulting the pages in:
	// registration costs the same at any size, and a page costs its fault when the data
	// path first touches it. For large buffers of which little may be used.
	AccessOnDemand AccessFlags = 64
)

// MR is a registered memory region (ibv_mr). The memory stays referenced by the MR until
// DeregMR; remote peers address it by IOVA and RKey.
type MR struct {
	pd       *PD
	r        *tpt.Region
	dead     bool
	onDemand bool
}

// RegMR registers buf for access through the device. Its IOVA (the address peers use in
// RDMA operations) is the buffer's virtual address. Remote write and remote atomic
// access require local write, as in libibverbs.
func (pd *PD) RegMR(buf []byte, access AccessFlags) (*MR, error) {
	if len(buf) == 0 {
		return nil, fmt.Errorf("verbs: RegMR: %w: empty buffer", ErrInvalid)
	}
	return pd.RegMRIOVA(buf, uint64(uintptr(unsafe.Pointer(&buf[0]))), access)
}

// RegMRIOVA registers buf with a chosen IOVA (ibv_reg_mr_iova): peers address byte i of
// buf as iova+i. Like ibv_reg_mr, registration faults the buffer's pages in (on Linux,
// without changing its contents), so that the data path does not take page faults,
// unless access has AccessOnDemand.
func (pd *PD) RegMRIOVA(buf []byte, iova uint64, access AccessFlags) (*MR, error) {
	if len(buf) == 0 {
		return nil, fmt.Errorf("verbs: RegMR: %w: empty buffer", ErrInvalid)
	}
	if uint64(len(buf)) > maxMRSize {
		return nil, fmt.Errorf("verbs: RegMR: %w: %d bytes exceed max_mr_size", ErrInvalid, len(buf))
	}
	if access&AccessOnDemand == 0 {
		// Otherwise the first remote WRITE into fresh memory takes a page fault per page
		// in the receive path, which then falls behind the socket: drops, retransmissions;
		// and the first send from it, one per page in the kernel (pages.KernelTouch).
		pages.Populate(buf)
		pages.KernelTouch(buf)
	}
	onDemand := access&AccessOnDemand != 0
	access &^= AccessOnDemand
	c := pd.ctx
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := pd.use(); err != nil {
		return nil, fmt.Errorf("verbs: RegMR: %w", err)
	}
	r, err := c.dev.MRs().Register(pd.id, buf, iova, tpt.Access(access))
	if err != nil {
		pd.users--
		if err == tpt.ErrTooMany {
			return nil, fmt.Errorf("verbs: RegMR: %w (max_mr %d)", ErrLimit, maxMR)
		}
		return nil, fmt.Errorf("verbs: RegMR: %w: %v", ErrInvalid, err)
	}
	c.mrs++
	return &MR{pd: pd, r: r, onDemand: onDemand}, nil
}

// DeregMR deregisters the region: from now on its keys are invalid for local and remote
// access. When it returns, no remote operation reads or writes the memory any more: a
// message that was using it (a multi-packet RDMA WRITE, a READ whose responses are still
// being sent or could be replayed, a SEND into a receive buffer in it) ends with a NAK and
// its QP in the error state, and the buffer is the application's again.
func (mr *MR) DeregMR() error {
	c := mr.pd.ctx
	c.mu.Lock()
	if mr.dead {
		c.mu.Unlock()
		return fmt.Errorf("verbs: DeregMR: %w", ErrClosed)
	}
	if err := c.dev.MRs().Deregister(mr.r); err != nil {
		c.mu.Unlock()
		return fmt.Errorf("verbs: DeregMR: %w", err)
	}
	mr.dead = true
	mr.pd.users--
	c.mrs--
	c.mu.Unlock()
	// Revoked: wait for an access that checked the region before that to finish.
	c.dev.Quiesce()
	return nil
}

// LKey returns the local key, used in SGEs.
func (mr *MR) LKey() uint32 { return mr.r.Key() }

// RKey returns the remote key, which peers use in RDMA operations.
func (mr *MR) RKey() uint32 { return mr.r.Key() }

// Addr returns the IOVA of the region's first byte.
func (mr *MR) Addr() uint64 { return mr.r.IOVA() }

// Len returns the region's length in bytes.
func (mr *MR) Len() int { return mr.r.Len() }

// Buf returns the registered memory.
func (mr *MR) Buf() []byte { return mr.r.Buf() }

// Access returns the access rights the region was registered with.
func (mr *MR) Access() AccessFlags {
	a := AccessFlags(mr.r.Access())
	if mr.onDemand {
		a |= AccessOnDemand
	}
	return a
}

// PD returns the protection domain the region belongs to.
func (mr *MR) PD() *PD { return mr.pd }

// SGE returns a scatter/gather element for bytes [off, off+length) of the region. An
// element that does not lie within the region (a negative offset or length, or one that
// reaches past the end) is refused, naming it, by the PostSend, PostRecv or PostSRQRecv
// it is given to; a length above 2^32-1 (what an SGE holds) is made one that is refused
// too, never cut short.
func (mr *MR) SGE(off, length int) SGE {
	l := uint32(length)
	if length < 0 || int64(length) > int64(^uint32(0)) {
		l = ^uint32(0) // above any message: refused, never truncated into range
	}
	return SGE{Addr: mr.r.IOVA() + uint64(off), Length: l, LKey: mr.r.Key()}
}

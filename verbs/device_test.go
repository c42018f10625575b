package verbs_test

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"runtime"
	"testing"
	"unsafe"

	"github.com/softrnic/softrnic/verbs"
)

// TestQueryDevice checks ibv_query_device: the device reports the documented limits and
// capabilities.
func TestQueryDevice(t *testing.T) {
	ctx := openDevice(t, ipA, verbs.DeviceConfig{})
	a := ctx.QueryDevice()
	checks := []struct {
		name      string
		got, want int64
	}{
		{"MaxQP", int64(a.MaxQP), 65536},
		{"MaxQPWR", int64(a.MaxQPWR), 16384},
		{"MaxSGE", int64(a.MaxSGE), 32},
		{"MaxInlineData", int64(a.MaxInlineData), 400},
		{"MaxQPRdAtom", int64(a.MaxQPRdAtom), 128},
		{"MaxQPInitRdAtom", int64(a.MaxQPInitRdAtom), 128},
		{"PhysPortCnt", int64(a.PhysPortCnt), 1},
		{"MaxMsgSize", int64(a.MaxMsgSize), 1 << 31},
		{"AtomicCap", int64(a.AtomicCap), int64(verbs.AtomicHCA)},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
	if a.NumCompVectors <= 0 {
		t.Errorf("NumCompVectors = %d, want > 0", a.NumCompVectors)
	}
	for name, v := range map[string]int{"MaxCQ": a.MaxCQ, "MaxCQE": a.MaxCQE, "MaxMR": a.MaxMR, "MaxPD": a.MaxPD} {
		if v <= 0 {
			t.Errorf("%s = %d, want > 0", name, v)
		}
	}
	if a.MaxMRSize == 0 || a.FWVer == "" || a.VendorID == 0 {
		t.Errorf("MaxMRSize %d, FWVer %q, VendorID %#x: want non-zero", a.MaxMRSize, a.FWVer, a.VendorID)
	}
	other := openDevice(t, ipB, verbs.DeviceConfig{NumCompVectors: 3})
	if n := other.QueryDevice().NumCompVectors; n != 3 {
		t.Errorf("NumCompVectors with DeviceConfig.NumCompVectors 3 = %d", n)
	}
	if a.NodeGUID == other.QueryDevice().NodeGUID {
		t.Errorf("two devices report the same NodeGUID %#x", a.NodeGUID)
	}
	if a.NumQueues < 1 || other.QueryDevice().NumQueues < 1 {
		t.Errorf("NumQueues %d and %d, want at least 1", a.NumQueues, other.QueryDevice().NumQueues)
	}
	if runtime.GOOS == "linux" {
		// Devices opened after other is closed: ipB's port is free again.
		other.Close()
		three := openDevice(t, ipB, verbs.DeviceConfig{Queues: 3})
		if n := three.QueryDevice().NumQueues; n != 3 {
			t.Errorf("NumQueues with DeviceConfig.Queues 3 = %d", n)
		}
		if len(three.Counters().Queues) != 3 {
			t.Errorf("Counters().Queues has %d entries, want 3", len(three.Counters().Queues))
		}
	}
	if _, err := verbs.OpenDevice(verbs.DeviceConfig{Addr: ipB, Port: verbs.AnyPort, Queues: 65}); err == nil {
		t.Error("65 queues accepted, want an error")
	}
}

// TestQueryGID checks ibv_query_gid: port 1 has one GID, at index 0, which is the
// device's IP address in IPv4-mapped form; other ports and indexes are invalid.
func TestQueryGID(t *testing.T) {
	ctx := openDevice(t, ipB, verbs.DeviceConfig{})
	gid, err := ctx.QueryGID(1, 0)
	if err != nil {
		t.Fatalf("QueryGID(1, 0): %v", err)
	}
	mapped := netip.AddrFrom16(ipB.As16())
	if gid != verbs.GIDFromAddr(ipB) || gid.Addr() != ipB || netip.AddrFrom16(gid) != mapped {
		t.Errorf("QueryGID(1, 0) = %v (% x), want the IPv4-mapped %v", gid, gid[:], ipB)
	}
	if gid.String() != ipB.String() || gid.IsZero() {
		t.Errorf("GID %v: String %q, IsZero %v", gid, gid.String(), gid.IsZero())
	}
	if ctx.Addr().Addr() != ipB || ctx.Addr().Port() == 0 {
		t.Errorf("Addr() = %v, want %v and the ephemeral port", ctx.Addr(), ipB)
	}
	for _, c := range []struct {
		port  uint8
		index int
	}{{0, 0}, {2, 0}, {255, 0}, {1, 1}, {1, -1}, {1, 128}} {
		if _, err := ctx.QueryGID(c.port, c.index); !errors.Is(err, verbs.ErrInvalid) {
			t.Errorf("QueryGID(%d, %d) error %v, want ErrInvalid", c.port, c.index, err)
		}
	}
}

// TestDeviceLimits checks that CreateCQ and CreateQP enforce the limits QueryDevice
// reports (cqe, completion vector, max_qp_wr, max_sge, max_inline_data) and reject
// invalid arguments with errors that wrap ErrInvalid or ErrLimit, while values at the
// limit are accepted.
func TestDeviceLimits(t *testing.T) {
	ctx := openDevice(t, ipA, verbs.DeviceConfig{NumCompVectors: 2})
	other := openDevice(t, ipB, verbs.DeviceConfig{})
	attr := ctx.QueryDevice()
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq := mustCQ(t, ctx, 16, nil)
	otherCQ := mustCQ(t, other, 16, nil)
	otherCh, err := other.CreateCompChannel()
	if err != nil {
		t.Fatal(err)
	}

	limitErr := func(err error) bool { return errors.Is(err, verbs.ErrInvalid) || errors.Is(err, verbs.ErrLimit) }

	cqCases := []struct {
		name   string
		cqe    int
		ch     *verbs.CompChannel
		vector int
	}{
		{"cqe 0", 0, nil, 0},
		{"cqe -1", -1, nil, 0},
		{"cqe > MaxCQE", attr.MaxCQE + 1, nil, 0},
		{"vector -2", 1, nil, -2},
		{"vector = NumCompVectors", 1, nil, attr.NumCompVectors},
		{"channel of another device", 1, otherCh, 0},
	}
	for _, c := range cqCases {
		if cq, err := ctx.CreateCQ(c.cqe, c.ch, c.vector); !limitErr(err) {
			t.Errorf("CreateCQ %s: (%v, %v), want an ErrInvalid or ErrLimit error", c.name, cq, err)
		}
	}
	last, err := ctx.CreateCQ(1, nil, attr.NumCompVectors-1)
	if err != nil {
		t.Fatalf("CreateCQ on the last completion vector: %v", err)
	}
	if last.CompVector() != attr.NumCompVectors-1 || last.CQE() < 1 || last.Device() != ctx || last.Channel() != nil {
		t.Errorf("CQ reports vector %d, cqe %d", last.CompVector(), last.CQE())
	}

	ok := verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}
	with := func(f func(*verbs.QPCap)) verbs.QPCap { c := ok; f(&c); return c }
	qpCases := []struct {
		name string
		attr *verbs.QPInitAttr
	}{
		{"nil attributes", nil},
		{"MaxSendWR 0", &verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: with(func(c *verbs.QPCap) { c.MaxSendWR = 0 })}},
		{"MaxSendWR > MaxQPWR", &verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: with(func(c *verbs.QPCap) { c.MaxSendWR = attr.MaxQPWR + 1 })}},
		{"MaxRecvWR > MaxQPWR", &verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: with(func(c *verbs.QPCap) { c.MaxRecvWR = attr.MaxQPWR + 1 })}},
		{"MaxSendSGE > MaxSGE", &verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: with(func(c *verbs.QPCap) { c.MaxSendSGE = attr.MaxSGE + 1 })}},
		{"MaxRecvSGE > MaxSGE", &verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: with(func(c *verbs.QPCap) { c.MaxRecvSGE = attr.MaxSGE + 1 })}},
		{"MaxSendSGE -1", &verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: with(func(c *verbs.QPCap) { c.MaxSendSGE = -1 })}},
		{"MaxInlineData > 400", &verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: with(func(c *verbs.QPCap) { c.MaxInlineData = attr.MaxInlineData + 1 })}},
		{"no send CQ", &verbs.QPInitAttr{RecvCQ: cq, Cap: ok}},
		{"no receive CQ", &verbs.QPInitAttr{SendCQ: cq, Cap: ok}},
		{"CQ of another device", &verbs.QPInitAttr{SendCQ: cq, RecvCQ: otherCQ, Cap: ok}},
		{"QP type UC", &verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: ok, QPType: 3}},
	}
	for _, c := range qpCases {
		if qp, err := pd.CreateQP(c.attr); !limitErr(err) {
			t.Errorf("CreateQP %s: (%v, %v), want an ErrInvalid or ErrLimit error", c.name, qp, err)
		}
	}
	max := verbs.QPCap{MaxSendWR: attr.MaxQPWR, MaxRecvWR: attr.MaxQPWR, MaxSendSGE: attr.MaxSGE,
		MaxRecvSGE: attr.MaxSGE, MaxInlineData: attr.MaxInlineData}
	qp, err := pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: max})
	if err != nil {
		t.Fatalf("CreateQP at every limit: %v", err)
	}
	if got, init := qp.QueryQP(); got.Cap != max || init.Cap != max || init.SendCQ != cq || init.RecvCQ != cq ||
		init.QPType != verbs.QPTypeRC || qp.State() != verbs.StateReset || qp.PD() != pd {
		t.Errorf("QueryQP: cap %+v, init %+v, state %v", got.Cap, init, qp.State())
	}
}

// TestClosedDevice checks that a closed device refuses to create objects with ErrClosed
// and that Close is idempotent.
func TestClosedDevice(t *testing.T) {
	ctx := openDevice(t, ipA, verbs.DeviceConfig{})
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq := mustCQ(t, ctx, 4, nil)
	if err := ctx.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := ctx.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := ctx.AllocPD(); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("AllocPD after Close: %v, want ErrClosed", err)
	}
	if _, err := ctx.CreateCQ(4, nil, 0); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("CreateCQ after Close: %v, want ErrClosed", err)
	}
	if _, err := ctx.CreateCompChannel(); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("CreateCompChannel after Close: %v, want ErrClosed", err)
	}
	if _, err := pd.RegMR(make([]byte, 8), 0); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("RegMR after Close: %v, want ErrClosed", err)
	}
	if _, err := pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1}}); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("CreateQP after Close: %v, want ErrClosed", err)
	}
}

// TestDeallocPDBusy checks ibv_dealloc_pd: it fails (EBUSY) while an MR or a QP uses the
// PD and succeeds once they are gone; a deallocated PD cannot be used or freed again.
func TestDeallocPDBusy(t *testing.T) {
	ctx := openDevice(t, ipA, verbs.DeviceConfig{})
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	if pd.Device() != ctx {
		t.Errorf("PD.Device() is not the device")
	}
	mr := mustReg(t, pd, make([]byte, 64), verbs.AccessLocalWrite)
	if err := pd.DeallocPD(); !errors.Is(err, verbs.ErrBusy) {
		t.Fatalf("DeallocPD with an MR: %v, want ErrBusy", err)
	}
	if err := mr.DeregMR(); err != nil {
		t.Fatalf("DeregMR: %v", err)
	}
	cq := mustCQ(t, ctx, 4, nil)
	qp, err := pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := pd.DeallocPD(); !errors.Is(err, verbs.ErrBusy) {
		t.Fatalf("DeallocPD with a QP: %v, want ErrBusy", err)
	}
	if err := qp.DestroyQP(); err != nil {
		t.Fatalf("DestroyQP: %v", err)
	}
	if err := pd.DeallocPD(); err != nil {
		t.Fatalf("DeallocPD of an unused PD: %v", err)
	}
	if err := pd.DeallocPD(); err == nil {
		t.Errorf("second DeallocPD succeeded")
	}
	if _, err := pd.RegMR(make([]byte, 8), 0); err == nil {
		t.Errorf("RegMR on a deallocated PD succeeded")
	}
	if _, err := pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1}}); err == nil {
		t.Errorf("CreateQP on a deallocated PD succeeded")
	}
}

// TestRegMRAccess checks ibv_reg_mr's argument rules: remote write and remote atomic
// access require local write, unknown access bits and empty buffers are invalid, and a
// valid registration reports its buffer, address, length, rights and PD.
func TestRegMRAccess(t *testing.T) {
	ctx := openDevice(t, ipA, verbs.DeviceConfig{})
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 100)
	cases := []struct {
		name   string
		buf    []byte
		access verbs.AccessFlags
		ok     bool
	}{
		{"no access", buf, 0, true},
		{"local write", buf, verbs.AccessLocalWrite, true},
		{"remote read only", buf, verbs.AccessRemoteRead, true},
		{"everything", buf, allAccess, true},
		{"on demand", buf, allAccess | verbs.AccessOnDemand, true},
		{"remote write without local write", buf, verbs.AccessRemoteWrite, false},
		{"remote atomic without local write", buf, verbs.AccessRemoteAtomic, false},
		{"remote write and read without local write", buf, verbs.AccessRemoteWrite | verbs.AccessRemoteRead, false},
		{"unknown access bit", buf, verbs.AccessLocalWrite | 1<<20, false},
		{"empty buffer", buf[:0], verbs.AccessLocalWrite, false},
		{"nil buffer", nil, verbs.AccessLocalWrite, false},
	}
	for _, c := range cases {
		mr, err := pd.RegMR(c.buf, c.access)
		if !c.ok {
			if !errors.Is(err, verbs.ErrInvalid) {
				t.Errorf("RegMR %s: (%v, %v), want ErrInvalid", c.name, mr, err)
			}
			if _, err := pd.RegMRIOVA(c.buf, 4096, c.access); !errors.Is(err, verbs.ErrInvalid) {
				t.Errorf("RegMRIOVA %s: %v, want ErrInvalid", c.name, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("RegMR %s: %v", c.name, err)
			continue
		}
		if mr.Addr() != uint64(uintptr(unsafe.Pointer(&c.buf[0]))) || mr.Len() != len(c.buf) ||
			mr.Access() != c.access || mr.PD() != pd || &mr.Buf()[0] != &c.buf[0] {
			t.Errorf("RegMR %s: Addr %#x Len %d Access %#x", c.name, mr.Addr(), mr.Len(), mr.Access())
		}
		if err := mr.DeregMR(); err != nil {
			t.Errorf("DeregMR %s: %v", c.name, err)
		}
	}
	if err := pd.DeallocPD(); err != nil {
		t.Errorf("DeallocPD after failed registrations: %v (a failed RegMR must not hold the PD)", err)
	}
}

// TestDeregMR checks ibv_dereg_mr and key allocation: the registrations alive at one time
// (even of the same memory) have distinct keys, a registration made right after a
// deregistration never gets back the key just freed (so a stale key of the old region
// does not reach the new one), and deregistering twice is an error.
func TestDeregMR(t *testing.T) {
	ctx := openDevice(t, ipA, verbs.DeviceConfig{})
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	live := map[uint32]*verbs.MR{}
	var mrs []*verbs.MR
	reg := func() *verbs.MR {
		t.Helper()
		mr := mustReg(t, pd, buf, allAccess)
		for _, k := range []uint32{mr.LKey(), mr.RKey()} {
			if other, ok := live[k]; ok && other != mr {
				t.Fatalf("key %#x is used by two live registrations", k)
			}
			live[k] = mr
		}
		mrs = append(mrs, mr)
		return mr
	}
	for i := 0; i < 64; i++ {
		reg()
	}
	for i := 0; i < 200; i++ {
		old := mrs[(i*7)%len(mrs)]
		if _, ok := live[old.LKey()]; !ok || live[old.LKey()] != old {
			continue
		}
		if err := old.DeregMR(); err != nil {
			t.Fatalf("DeregMR: %v", err)
		}
		delete(live, old.LKey())
		delete(live, old.RKey())
		if mr := reg(); mr.LKey() == old.LKey() || mr.RKey() == old.RKey() {
			t.Fatalf("registration after DeregMR got the freed key %#x again", old.LKey())
		}
	}
	mr := reg()
	if err := mr.DeregMR(); err != nil {
		t.Fatalf("DeregMR: %v", err)
	}
	if err := mr.DeregMR(); err == nil {
		t.Errorf("second DeregMR succeeded")
	}
	if err := mrs[0].DeregMR(); err == nil {
		t.Errorf("DeregMR of a region deregistered earlier succeeded")
	}
}

// TestObjectLifecycle checks destroy rules: a CQ cannot be destroyed while a QP uses it,
// destroying twice is an error, and a destroyed CQ cannot be used for a new QP.
func TestObjectLifecycle(t *testing.T) {
	ctx := openDevice(t, ipA, verbs.DeviceConfig{})
	s := newSide(t, ctx, verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1}, 4, false)
	if err := s.scq.DestroyCQ(); !errors.Is(err, verbs.ErrBusy) {
		t.Errorf("DestroyCQ of a CQ a QP uses: %v, want ErrBusy", err)
	}
	if err := s.qp.DestroyQP(); err != nil {
		t.Fatalf("DestroyQP: %v", err)
	}
	if err := s.qp.DestroyQP(); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("second DestroyQP: %v, want ErrClosed", err)
	}
	if err := s.qp.ModifyQP(&verbs.QPAttr{QPState: verbs.StateErr}, verbs.QPAttrState); err == nil {
		t.Errorf("ModifyQP of a destroyed QP succeeded")
	}
	if err := s.scq.DestroyCQ(); err != nil {
		t.Errorf("DestroyCQ: %v", err)
	}
	if err := s.scq.DestroyCQ(); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("second DestroyCQ: %v, want ErrClosed", err)
	}
	if _, err := s.pd.CreateQP(&verbs.QPInitAttr{SendCQ: s.scq, RecvCQ: s.rcq, Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1}}); err == nil {
		t.Errorf("CreateQP with a destroyed CQ succeeded")
	}
	if err := s.pd.DeallocPD(); err != nil {
		t.Errorf("DeallocPD after the QP was destroyed and a CreateQP failed: %v", err)
	}
}

// TestRegMRIOVA checks ibv_reg_mr_iova: the region is addressed by the chosen IOVA, both
// remotely (RDMA WRITE, READ and atomics land at iova+offset) and locally (SGE addresses
// are IOVAs), not by its virtual address; an IOVA range that wraps around is invalid.
func TestRegMRIOVA(t *testing.T) {
	a, b := defaultPair(t)
	const iova = uint64(1) << 50 // far from any virtual address
	remote, err := b.pd.RegMRIOVA(make([]byte, 8192), iova, allAccess)
	if err != nil {
		t.Fatal(err)
	}
	if remote.Addr() != iova || remote.Len() != 8192 {
		t.Fatalf("Addr %#x Len %d, want %#x and 8192", remote.Addr(), remote.Len(), iova)
	}
	local, err := a.pd.RegMRIOVA(pattern(8192, 130), 0x4000, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	if sg := local.SGE(10, 20); sg.Addr != 0x4000+10 || sg.LKey != local.LKey() {
		t.Errorf("SGE(10, 20) = %+v, want address %#x", sg, 0x4000+10)
	}
	mustPostSend(t, a.qp,
		verbs.SendWR{WRID: 1, Opcode: verbs.WRRDMAWrite, SendFlags: verbs.SendSignaled, SGList: sge(local, 100, 3000),
			RemoteAddr: iova + 1000, RKey: remote.RKey()},
		verbs.SendWR{WRID: 2, Opcode: verbs.WRRDMARead, SendFlags: verbs.SendSignaled, SGList: sge(local, 5000, 500),
			RemoteAddr: iova + 1500, RKey: remote.RKey()},
		verbs.SendWR{WRID: 3, Opcode: verbs.WRAtomicFetchAndAdd, SendFlags: verbs.SendSignaled, SGList: sge(local, 6000, 8),
			RemoteAddr: iova + 8000, RKey: remote.RKey(), CompareAdd: 5})
	wcs := pollN(t, a.scq, 3)
	wantSendWC(t, wcs[0], 1, verbs.WCRDMAWrite, a.qp)
	wantSendWC(t, wcs[1], 2, verbs.WCRDMARead, a.qp)
	wantSendWC(t, wcs[2], 3, verbs.WCFetchAdd, a.qp)
	settle(b.ctx)
	want := pattern(8192, 130)
	checkBytes(t, "WRITE at iova+1000", remote.Buf()[1000:4000], want[100:3100])
	checkBytes(t, "READ from iova+1500", local.Buf()[5000:5500], want[600:1100])
	if got := binary.NativeEndian.Uint64(remote.Buf()[8000:]); got != 5 {
		t.Errorf("fetch-and-add at iova+8000 left %d, want 5", got)
	}

	// The virtual address is not an address of the region.
	va := uint64(uintptr(unsafe.Pointer(&remote.Buf()[0])))
	mustPostSend(t, a.qp, verbs.SendWR{WRID: 4, Opcode: verbs.WRRDMAWrite, SendFlags: verbs.SendSignaled,
		SGList: sge(local, 0, 8), RemoteAddr: va, RKey: remote.RKey()})
	wantStatus(t, pollOne(t, a.scq), 4, verbs.WCRemAccessErr, a.qp)

	if _, err := b.pd.RegMRIOVA(make([]byte, 16), ^uint64(0)-7, verbs.AccessLocalWrite); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("RegMRIOVA wrapping around the address space: %v, want ErrInvalid", err)
	}
}

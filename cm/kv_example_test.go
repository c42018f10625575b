package cm_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/verbs"
)

// A key-value table served from one registered buffer: the server's CPU takes no part in
// reads and writes. Each slot is 64 bytes: a version word (even: stable, odd: being
// written) and the value. The client reads a slot with RDMA READ, takes it with
// compare-and-swap on its version word, writes the new value with RDMA WRITE, releases it
// with fetch-and-add, and tells the server with a SEND. Atomics work on 8-byte words at
// 8-byte-aligned addresses, in the host's byte order.
func ExampleDialQP_keyValue() {
	const slotSize, slots = 64, 16384 // 1 MiB
	ctx := context.Background()
	open := func(ip string) *verbs.Device {
		dev, err := verbs.OpenDevice(verbs.DeviceConfig{Addr: netip.MustParseAddr(ip), Port: verbs.AnyPort})
		if err != nil {
			panic(err)
		}
		return dev
	}

	// Server: the table, open to the client's reads, writes and atomics.
	srv := open("127.0.0.2")
	defer srv.Close()
	pd, _ := srv.AllocPD()
	table, _ := pd.RegMR(make([]byte, slotSize*slots),
		verbs.AccessLocalWrite|verbs.AccessRemoteRead|verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic)
	copy(table.Buf()[3*slotSize+8:], "old value")
	inbox, _ := pd.RegMR(make([]byte, 64), verbs.AccessLocalWrite)
	l, err := cm.Listen(srv, 7471)
	if err != nil {
		panic(err)
	}
	defer l.Close()
	served := make(chan string)
	go func() {
		key := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint64(nil, table.Addr()), table.RKey())
		ep, err := l.AcceptQP(ctx, &cm.QPConfig{PD: pd, Recv: []verbs.RecvWR{{SGList: []verbs.SGE{inbox.SGE(0, 64)}}}},
			&cm.AcceptParams{PrivateData: key})
		if err != nil {
			panic(err)
		}
		defer ep.Close()
		wc := make([]verbs.WorkCompletion, 1)
		ep.CQ().Wait(ctx, wc) // the client's notice
		slot := binary.NativeEndian.Uint64(inbox.Buf())
		s := table.Buf()[slot*slotSize:]
		served <- fmt.Sprintf("server: slot %d is version %d, %q", slot, binary.NativeEndian.Uint64(s), s[8:17])
	}()

	// Client.
	cli := open("127.0.0.1")
	defer cli.Close()
	ep, err := cm.DialQP(ctx, cli, netip.AddrPortFrom(srv.Addr().Addr(), 7471), nil,
		&cm.DialParams{DevicePort: srv.Addr().Port()})
	if err != nil {
		panic(err)
	}
	defer ep.Close()
	base, rkey := binary.BigEndian.Uint64(ep.PrivateData()), binary.BigEndian.Uint32(ep.PrivateData()[8:])
	local, _ := ep.RegMR(make([]byte, 2*slotSize), verbs.AccessLocalWrite)
	buf := local.Buf()
	// do posts one work request and waits for its completion.
	do := func(wr verbs.SendWR) {
		wr.SendFlags = verbs.SendSignaled
		if err := ep.QP().PostSend([]verbs.SendWR{wr}); err != nil {
			panic(err)
		}
		wc := make([]verbs.WorkCompletion, 1)
		if _, err := ep.CQ().Wait(ctx, wc); err != nil || wc[0].Status != verbs.WCSuccess {
			panic(fmt.Sprint(wr.Opcode, ": ", err, wc[0].Status))
		}
	}
	const slot = 3
	at := base + slot*slotSize

	do(verbs.SendWR{Opcode: verbs.WRRDMARead, SGList: []verbs.SGE{local.SGE(0, slotSize)}, RemoteAddr: at, RKey: rkey})
	version := binary.NativeEndian.Uint64(buf)
	fmt.Printf("client: read version %d, %q\n", version, buf[8:17])

	// Take the slot: version -> version+1 if nobody changed it since the read. The
	// original value comes back into the local buffer.
	do(verbs.SendWR{Opcode: verbs.WRAtomicCmpAndSwp, SGList: []verbs.SGE{local.SGE(slotSize, 8)}, RemoteAddr: at, RKey: rkey,
		CompareAdd: version, Swap: version + 1})
	if got := binary.NativeEndian.Uint64(buf[slotSize:]); got != version {
		panic("slot taken by another writer")
	}
	copy(buf[slotSize+8:], "new value")
	do(verbs.SendWR{Opcode: verbs.WRRDMAWrite, SGList: []verbs.SGE{local.SGE(slotSize+8, 9)}, RemoteAddr: at + 8, RKey: rkey})
	do(verbs.SendWR{Opcode: verbs.WRAtomicFetchAndAdd, SGList: []verbs.SGE{local.SGE(slotSize, 8)}, RemoteAddr: at, RKey: rkey,
		CompareAdd: 1}) // released: version+2
	binary.NativeEndian.PutUint64(buf, slot)
	do(verbs.SendWR{Opcode: verbs.WRSend, SGList: []verbs.SGE{local.SGE(0, 8)}})
	fmt.Println(<-served)
	// Output:
	// client: read version 0, "old value"
	// server: slot 3 is version 2, "new value"
}

//go:build linux

package rxevm_test

import (
	"context"
	"fmt"
	"time"

	"github.com/softrnic/softrnic/interop/rxevm"
)

// Boot the VM, run a command in the guest, and see what rxe counted meanwhile. (Not run
// by go test: it needs root, QEMU and a kernel with rdma_rxe; Available says what is
// missing, and the interop package's tests use the VM this way.)
func ExampleStart() {
	if err := rxevm.Available(); err != nil {
		fmt.Println("no VM here:", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	vm, err := rxevm.Start(ctx, rxevm.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer vm.Close()
	before, _ := vm.Counters(ctx)
	out, _, rc, err := vm.Exec(ctx, "ibv_devinfo -d rxe0 | grep state")
	fmt.Println(out, rc, err)
	after, _ := vm.Counters(ctx)
	fmt.Println("rxe counted:", after.Sub(before))
}

// Counters taken before and after a test: Sub gives what the test made rxe count, and
// String lists only the counters that moved.
func ExampleCounters_Sub() {
	before := rxevm.Counters{"sent_pkts": 100, "rcvd_pkts": 90, "duplicate_request": 0}
	after := rxevm.Counters{"sent_pkts": 130, "rcvd_pkts": 120, "duplicate_request": 0}
	fmt.Println(after.Sub(before))
	// Output:
	// {rcvd_pkts=30 sent_pkts=30}
}

// Package interop holds softrnic's interoperability tests against Linux soft-RoCE
// (rdma_rxe), the standard RoCEv2 peer: the kernel's rxe runs in a small QEMU VM driven by
// package [github.com/softrnic/softrnic/interop/rxevm], with the host's rdma-core,
// perftest and rdmacm-utils binaries, on a private link in a network namespace of its own.
//
// All tests of the package share one VM, booted by the first test that calls sharedVM
// and closed by TestMain. A test that needs the VM starts with
//
//	vm := sharedVM(t) // skips when the VM cannot run here (see rxevm.Available)
//
// and then runs guest commands (vm.Exec, vm.Spawn), host programs in the namespace
// (vm.HostCommand, vm.InNamespace) and reads rxe's counters (vm.Counters). Tests must leave
// the VM as they found it (kill their guest servers: Job.Wait with a deadline does).
//
// The tests run only with SOFTRNIC_INTEROP=on (or require); they skip without root or the
// packages (rxevm.AptInstall) and under -short; SOFTRNIC_INTEROP=require makes a missing
// piece a failure instead (for CI machines that are meant to run them). See README.md.
package interop

// guesthello is built by the interop tests on the host and run in the guest: it shows that
// a Go binary built by a test runs there (statically linked, from the VM's shared dir).
package main

import (
	"fmt"
	"os"
)

func main() {
	h, err := os.Hostname()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("hello from %s, args %q\n", h, os.Args[1:])
}

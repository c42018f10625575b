//go:build darwin || freebsd

package netio

import "golang.org/x/sys/unix"

// ipDontFrag is the IPv4 socket option that sets DF on every datagram.
const ipDontFrag = unix.IP_DONTFRAG

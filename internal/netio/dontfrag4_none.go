//go:build !linux && !darwin && !freebsd

package netio

// ipDontFrag is -1: this system has no IPv4 socket option that sets DF on every datagram
// (NetBSD, OpenBSD and DragonFly have only IPV6_DONTFRAG).
const ipDontFrag = -1

// Package rsocket is a stream socket over RDMA: a net.Conn and a net.Listener that speak
// the protocol of librdmacm's rsockets (rsocket(7)), so that Go programs written for
// net.Conn (net/http, gRPC, anything over io.Reader and io.Writer) run over softrnic
// unchanged, and C programs using rsockets on Linux are their peers.
//
//	l, err := rsocket.Listen(dev, 7471)                                      // server
//	c, err := l.Accept()
//
//	c, err := rsocket.Dial(ctx, dev, netip.MustParseAddrPort("10.0.0.2:7471")) // client
//
// A connection is an RC queue pair made through the connection manager (package cm), in
// rdma_cm's TCP port space; each side's receive ring, grant slots and credits travel in
// the connection's private data. Bytes move as RDMA WRITEs WITH IMMEDIATE into the
// peer's ring, within the space the peer has granted, and the peer grants the space again
// as it reads, half a ring at a time. Read and Write behave as a TCP connection's do,
// deadlines, half-close and Close included; Write copies into a registered send buffer,
// and ReadFrom and WriteTo (which io.Copy uses) copy each byte once.
//
// IOMap and IOWrite are rsockets' riomap and riowrite: direct RDMA WRITEs into a
// buffer the peer mapped, around the stream.
//
// Options (buffer and queue sizes, the ordering mode) are set on a Dialer or a
// ListenConfig, as a C program sets socket options before connecting. docs/rsocket.md
// describes the protocol, what softrnic leaves out of it, and the figures.
package rsocket
